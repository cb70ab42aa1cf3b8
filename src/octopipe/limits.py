"""The bounds on every size and number OctoPipe accepts, in one table (docs/FORMATS.md, "Limits").

Each command checks its sizes against these before it allocates anything, and every number read
from a file or a flag is finite and within its unit's range, so that no input, however large,
makes a command run out of memory, overflow to infinity or run without end. The bounds are far
beyond any real job (the largest are a cluster of 100k GPUs, a million layers); they exist to
turn a typo into one line instead of an hour of swapping.

The field types below carry the bounds into pydantic models of file formats: a new optional
key is one line, e.g. `bucket_bytes: ByteCount = 0`. They are strict: a string, or `true`, is
not a number, and `4.0` is not a count.
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import AfterValidator, Field

# --- sizes of a job -----------------------------------------------------------------------------
MAX_LAYERS = 1_000_000  # layers of a profile or model
# Layers a config.json declares (text, vision and global layers together): each is estimated
# or built one by one (`profile-arch` of 4,096 tiny-llama layers: 1.6 s of CPU, its plan: the
# tuner's budget; a million ran past 120 s; BENCHMARKS.md), far beyond any published model
# (Llama 3 405B: 126).
MAX_CONFIG_LAYERS = 4096
MAX_DEVICES = 4096  # pipeline devices of a profile or plan (--devices)
MAX_MICROBATCHES = 2**18  # microbatches per step (--microbatches, num_microbatches)
MAX_STAGE_MICROBATCHES = 2**22  # stages x microbatches of one plan: its (stage, microbatch) pairs
MAX_GPUS = 2**17  # GPUs of a cluster (--gpus)
MAX_GLOBAL_BATCH = 2**20  # samples per step (--global-batch)
MAX_WORKERS = 256  # processes of one layout search (plan --gpus --workers)
MAX_SEQ_LEN = 2**24  # tokens per sample (--seq-len)
MAX_MICRO_BATCH_SIZE = 2**16  # samples per microbatch (--micro-batch-size)
MAX_MICROBATCH_TOKENS = 2**20  # --seq-len x --micro-batch-size a run or `profile` allocates
MAX_ESTIMATED_TOKENS = 2**28  # the same for the analytic cost model (nothing is allocated)
MAX_PARALLEL_DEGREE = 2**17  # TP, DP, or any other degree
MAX_CHUNKS = 64  # stages per device the tuner tries (--max-chunks)
MAX_PROCESSES = 1024  # ranks one host starts (--nproc, the plan's devices x --dp)
MAX_STEPS = 10**9  # training steps of a run (--steps)
MAX_EVAL_BATCHES = 10**6  # held-out global batches per evaluation (--eval-batches)
MAX_SEED = 2**63 - 1  # --seed: what torch's generators take

# --- numbers ------------------------------------------------------------------------------------
MAX_SECONDS = 1e6  # any duration: a layer's time, a latency, a timeout, a time budget
MIN_TIMEOUT_S = 1.0  # --timeout: below this, the ranks could not even meet
# A hung transfer fails after this instead of blocking forever (`--timeout`'s default).
DEFAULT_TIMEOUT_S = 120.0
MAX_RATE = 1e6  # --lr, --min-lr, --weight-decay, --clip-norm
MAX_BYTES = 2**60  # any byte figure: memory, activations, parameters, messages
MIN_BANDWIDTH, MAX_BANDWIDTH = 1.0, 1e18  # bytes per second (a divisor: never near 0)
MIN_SPEED, MAX_SPEED = 1e-6, 1e6  # a device's speed relative to 1.0 (a divisor too)
MAX_INPUT_FILE_BYTES = 2**30  # a JSON file read whole (a profile of a million layers: ~250 MB)
MAX_TEXT_SETTING_CHARS = 4096  # a name or path given as a setting or flag (Linux's PATH_MAX)


def check_microbatch_tokens(seq_len: int, micro_batch_size: int, limit: int) -> None:
    """Tokens of one microbatch, bounded before anything is estimated or allocated."""
    from octopipe.errors import InputError

    tokens = seq_len * micro_batch_size
    if tokens > limit:
        raise InputError(
            "--micro-batch-size",
            f"{micro_batch_size:,} samples of {seq_len:,} tokens are {tokens:,} tokens per "
            f"microbatch; at most {limit:,}",
        )


# --- field types for file formats ------------------------------------------------------------


def _at_most(limit: float) -> AfterValidator:
    """Finite up to `limit`, or inf: "unlimited", a default no file can hold (strict JSON has
    no infinity; `jsonfile` refuses 1e400)."""

    def check(value: float) -> float:
        if math.isnan(value) or (value > limit and value != math.inf):
            raise ValueError(f"must be at most {limit:g}")
        return value

    return AfterValidator(check)


Seconds = Annotated[float, Field(strict=True, ge=0, le=MAX_SECONDS, allow_inf_nan=False)]
ByteCount = Annotated[int, Field(strict=True, ge=0, le=MAX_BYTES)]
Capacity = Annotated[float, Field(strict=True, gt=0), _at_most(MAX_BYTES)]  # inf: unlimited
Bandwidth = Annotated[float, Field(strict=True, ge=MIN_BANDWIDTH), _at_most(MAX_BANDWIDTH)]
Speed = Annotated[float, Field(strict=True, ge=MIN_SPEED, le=MAX_SPEED, allow_inf_nan=False)]
Index = Annotated[int, Field(strict=True, ge=0, le=MAX_GPUS)]  # a device's node, a rank
Degree = Annotated[int, Field(strict=True, ge=1, le=MAX_PARALLEL_DEGREE)]
MicroBatchSize = Annotated[int, Field(strict=True, ge=1, le=MAX_MICRO_BATCH_SIZE)]
SeqLen = Annotated[int, Field(strict=True, ge=1, le=MAX_SEQ_LEN)]
Text = Annotated[str, Field(strict=True, max_length=4096)]
Flag = Annotated[bool, Field(strict=True)]
