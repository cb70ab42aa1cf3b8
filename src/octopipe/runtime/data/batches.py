"""Training data: global batches, and one replica's share of one, split into microbatches.

A global batch holds `D * M * b` sequences (D replicas, M microbatches of b sequences); replica
r takes sequences `[r*M*b, (r+1)*M*b)` and cuts them into M microbatches. Sequence i of step t
is drawn from (seed, t, i) alone, by the synthetic source and by a token file alike, so one seed
and one global batch give the same data, hence the same losses, whatever the plan and D.

Sources: `SyntheticData` (the model's own `synthetic_sequence`), `TokenFile` (a flat file of
little-endian token ids, memory-mapped, nanoGPT style: targets are the inputs shifted by one)
and `GivenBatches` (global batches a caller hands in from Python).
"""

from __future__ import annotations

import copy
import itertools
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from octopipe.errors import InputError
from octopipe.tokens.meta import META, TokenMeta, meta_beside

Activation = tuple[torch.Tensor, ...]
TOKEN_DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


@dataclass(frozen=True)
class GlobalBatch:
    """One step's data for every replica: dimension 0 of every tensor counts sequences."""

    inputs: Activation
    targets: torch.Tensor

    @property
    def sequences(self) -> int:
        return int(self.targets.shape[0])


@dataclass(frozen=True)
class Batch:
    """One replica's step, split into microbatches."""

    inputs: list[Activation]
    targets: list[torch.Tensor]


class DataSource:
    """Random access by step: resuming at step t needs no replay of the steps before it."""

    def global_batch(self, step: int, sequences: int) -> GlobalBatch:
        raise NotImplementedError

    def for_vocabulary(self, size: int | None) -> DataSource:
        """This source for a model taking token ids below `size` (None: any input)."""
        return self


def sequence_generator(seed: int, step: int, index: int) -> torch.Generator:
    # Python's hash of a tuple of ints is stable across processes (no string hashing).
    return torch.Generator().manual_seed(hash((seed, step, index)) & 0x7FFF_FFFF_FFFF_FFFF)


def stack(sequences: Sequence[tuple[Activation, torch.Tensor]]) -> GlobalBatch:
    inputs = tuple(torch.stack(parts) for parts in zip(*(x for x, _ in sequences)))
    return GlobalBatch(inputs, torch.stack([t for _, t in sequences]))


class SyntheticData(DataSource):
    def __init__(
        self,
        sequence: Callable[[torch.Generator, int], tuple[Activation, torch.Tensor]],
        seq_len: int,
        seed: int,
    ) -> None:
        self.sequence, self.seq_len, self.seed = sequence, seq_len, seed

    def global_batch(self, step: int, sequences: int) -> GlobalBatch:
        return stack(
            [
                self.sequence(sequence_generator(self.seed, step, i), self.seq_len)
                for i in range(sequences)
            ]
        )


# The file of a `prepare-data` folder each flag takes when given the folder.
FOLDER_FILES = {"--data": "train.bin", "--val-data": "val.bin"}


def token_file_of(path: str | Path, flag: str = "--data") -> Path:
    """The token file `path` names: itself, or for a folder (`prepare-data`'s) its train.bin
    (`--data`) or val.bin (`--val-data`)."""
    path = Path(path)
    if path.is_dir():
        name = FOLDER_FILES.get(flag, FOLDER_FILES["--data"])
        if not (path / name).is_file():
            raise InputError(
                flag, f"{path} is a folder without {name} (prepare-data's folder holds one)"
            )
        return path / name
    if not path.is_file():
        from octopipe.outfiles import not_regular

        kind = not_regular(path) if os.path.lexists(path) else None
        if kind is not None:  # /dev/null, a FIFO: it is there, but no token file
            raise InputError(flag, f"{path} is {kind}, not a file of token ids")
        raise InputError(flag, f"no such file or folder: {path}")
    return path


class TokenFile(DataSource):
    """Windows of `seq_len + 1` tokens at offsets drawn from (seed, step, index), from a token
    file or a `prepare-data` folder (`token_file_of`).

    A `meta.json` beside the file (`octopipe prepare-data`'s, `octopipe.tokens.meta`) says its
    dtype, which is then the default, and its tokenizer's vocabulary, which the model's must
    hold; the file must hold the tokens it says. `flag` names the file in messages."""

    def __init__(
        self,
        path: str | Path,
        seq_len: int,
        seed: int,
        dtype: str | None = None,
        flag: str = "--data",
    ) -> None:
        path = token_file_of(path, flag)
        described = meta_beside(path)
        if dtype is None:
            dtype = described[1].dtype if described else "uint16"
        if dtype not in TOKEN_DTYPES:
            raise InputError("--data-dtype", f"expected one of {sorted(TOKEN_DTYPES)}, got {dtype}")
        width = np.dtype(TOKEN_DTYPES[dtype]).itemsize
        size = path.stat().st_size
        if described:
            _check_described(path, dtype, size, *described)
        if size % width:
            raise InputError(flag, f"{path} is {size} bytes, not a whole number of {dtype}")
        if size // width < seq_len + 1:
            raise InputError(flag, f"{path} holds {size // width} tokens, fewer than --seq-len + 1")
        self.path, self.dtype, self.seq_len, self.seed, self.flag = path, dtype, seq_len, seed, flag
        self.vocabulary: int | None = None  # ids at or above it are refused as they are read
        self.tokenizer_vocabulary = described[1].vocab_size if described else None
        self._tokens: np.memmap | None = None

    def for_vocabulary(self, size: int | None) -> TokenFile:
        vocab = self.tokenizer_vocabulary
        if size is not None and vocab is not None and vocab > size:
            raise InputError(
                self.flag,
                f"{self.path} holds ids of a tokenizer of {vocab:,} (its {META}); the model "
                f"takes {size:,}: tokenize with the model's tokenizer, or give the model a "
                "vocabulary as large",
            )
        checked = copy.copy(self)
        checked.vocabulary = size
        return checked

    @property
    def tokens(self) -> np.memmap:
        if self._tokens is None:  # opened in the process that reads, not pickled across
            self._tokens = np.memmap(self.path, dtype=TOKEN_DTYPES[self.dtype], mode="r")
        return self._tokens

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_tokens": None}

    def global_batch(self, step: int, sequences: int) -> GlobalBatch:
        starts = len(self.tokens) - self.seq_len
        rows = []
        for i in range(sequences):
            gen = sequence_generator(self.seed, step, i)
            at = int(torch.randint(0, starts, (1,), generator=gen))
            window = torch.from_numpy(self.tokens[at : at + self.seq_len + 1].astype(np.int64))
            if self.vocabulary is not None and int(window.max()) >= self.vocabulary:
                bad = int(torch.nonzero(window >= self.vocabulary)[0]) + at
                raise InputError(
                    self.flag,
                    f"{self.path} holds token id {int(self.tokens[bad])} at token {bad:,}, "
                    f"beyond the model's vocabulary of {self.vocabulary:,} (is --data-dtype "
                    f"{self.dtype} "
                    "the file's?)",
                )
            rows.append(((window[:-1],), window[1:]))
        return stack(rows)


def _check_described(path: Path, dtype: str, size: int, where: Path, meta: TokenMeta) -> None:
    """The token file is what its meta.json says: ids of that dtype, and as many."""
    if dtype != meta.dtype:
        raise InputError(
            "--data-dtype", f"{dtype}, but {where} says {path.name} holds {meta.dtype} ids"
        )
    entry = meta.files.get(path.name)
    width = np.dtype(TOKEN_DTYPES[dtype]).itemsize
    if entry is not None and entry.tokens * width != size:
        raise InputError(
            str(path),
            f"holds {size:,} bytes; {where} says {entry.tokens:,} {dtype} tokens "
            f"({entry.tokens * width:,} bytes): a file changed since it was written",
        )


class GivenBatches(DataSource):
    """Global batches from Python: a sequence (indexed by step) or any iterable (read in order;
    a resumed run skips the steps before its first). A batch is a `GlobalBatch` or a pair
    `(inputs, targets)`: `inputs` the model's forward arguments, a tuple of tensors (or one
    tensor), `targets` a tensor, every one with a row per sequence (dimension 0). A sequence
    of batches is checked whole when it is given, an iterable's batches as they are read."""

    def __init__(self, batches: Sequence[GlobalBatch] | Iterable[GlobalBatch]) -> None:
        if isinstance(batches, Sequence):
            batches = [as_global_batch(b, step) for step, b in enumerate(batches)]
        self.batches = batches
        self.vocabulary: int | None = None
        self._iterator: Iterable[GlobalBatch] | None = None
        self._next = 0
        self._last: tuple[int, GlobalBatch] | None = None  # a step read twice reads once

    def check_length(self, needed: int, what: str) -> None:
        """Refuse a sequence of batches shorter than the run reads (`what` says why)."""
        if isinstance(self.batches, Sequence) and len(self.batches) < needed:
            raise InputError("data", f"holds {len(self.batches)} batches; {what} reads {needed}")

    def for_vocabulary(self, size: int | None) -> GivenBatches:
        checked = copy.copy(self)
        checked.vocabulary = size
        return checked

    def global_batch(self, step: int, sequences: int) -> GlobalBatch:
        if isinstance(self.batches, Sequence):
            if not 0 <= step < len(self.batches):
                raise InputError(
                    "data", f"holds {len(self.batches)} batches; step {step + 1} needs one"
                )
            batch = self.batches[step]
        elif self._last is not None and self._last[0] == step:
            batch = self._last[1]
        else:
            if self._iterator is None or step < self._next:
                self._iterator, self._next = iter(self.batches), 0
            batch = next(itertools.islice(self._iterator, step - self._next, None))
            self._next = step + 1
            self._last = (step, batch)
        batch = as_global_batch(batch, step)
        if batch.sequences != sequences:
            raise InputError(
                "data",
                f"{_batch(step)} holds {batch.sequences} sequences, not {sequences} "
                "(replicas x microbatches x microbatch size)",
            )
        _check_ids(batch, self.vocabulary, step)
        return batch


def _batch(index: int, part: str = "batch") -> str:
    """A step's batch (or its inputs or targets) as messages name it: the step from 1, as the
    run's lines number it, and the batch's place in the data."""
    at = {"batch": "", "inputs": "[0]", "targets": "[1]"}[part]
    return f"step {index + 1}'s {part} (data[{index}]{at})"


def as_global_batch(batch, step: int) -> GlobalBatch:
    """A batch given from Python, checked: `(inputs, targets)` as `GivenBatches` says."""
    if isinstance(batch, GlobalBatch):
        return batch
    if not (isinstance(batch, tuple | list) and len(batch) == 2):
        raise InputError(
            "data",
            f"{_batch(step)} is a {type(batch).__name__}; expected (inputs, targets), e.g. "
            "((tokens,), targets): the model's forward arguments and the loss's targets",
        )
    inputs, targets = batch
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)  # one forward argument
    if not (
        isinstance(inputs, tuple | list)
        and inputs
        and all(isinstance(t, torch.Tensor) and t.dim() >= 1 for t in inputs)
    ):
        raise InputError(
            "data",
            f"{_batch(step, 'inputs')}: expected a tensor or a tuple of tensors (the model's "
            "forward arguments), each with a row per sequence",
        )
    if not (isinstance(targets, torch.Tensor) and targets.dim() >= 1):
        raise InputError(
            "data", f"{_batch(step, 'targets')}: expected a tensor with a row per sequence"
        )
    rows = {int(t.shape[0]) for t in (*inputs, targets)}
    if len(rows) > 1:
        raise InputError(
            "data",
            f"{_batch(step)}: inputs and targets of different numbers of rows: {sorted(rows)}",
        )
    return GlobalBatch(tuple(inputs), targets)


def _check_ids(batch: GlobalBatch, vocabulary: int | None, step: int) -> None:
    """Token ids a model's embedding cannot look up are refused, as from a token file."""
    ids = batch.inputs[0]
    if vocabulary is None or ids.is_floating_point() or ids.numel() == 0:
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocabulary:
        bad = low if low < 0 else high
        raise InputError(
            "data",
            f"{_batch(step, 'inputs')} hold token id {bad}, outside the model's "
            f"vocabulary of {vocabulary:,}",
        )


def split_sequences(batch: GlobalBatch, share: int) -> list[GlobalBatch]:
    """`batch` cut in order into global batches of `share` sequences (the passes of a step
    that accumulates gradients)."""
    return [
        GlobalBatch(tuple(t[lo : lo + share] for t in batch.inputs), batch.targets[lo : lo + share])
        for lo in range(0, batch.sequences, share)
    ]


def replica_batch(
    batch: GlobalBatch, replica: int, num_microbatches: int, micro_batch_size: int
) -> Batch:
    """Replica `replica`'s sequences of the global batch, in microbatches of `micro_batch_size`."""
    share = num_microbatches * micro_batch_size
    lo = replica * share

    def cut(t: torch.Tensor, m: int) -> torch.Tensor:
        return t[lo + m * micro_batch_size : lo + (m + 1) * micro_batch_size]

    return Batch(
        [tuple(cut(t, m) for t in batch.inputs) for m in range(num_microbatches)],
        [cut(batch.targets, m) for m in range(num_microbatches)],
    )
