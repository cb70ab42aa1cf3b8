"""What `octopipe run` carries out of a layout, so that `plan --gpus` answers only with layouts it
can run: one rule per parallelism, each saying why not in words (the executor's own refusals,
`runtime/parallel/context.py`, `octopipe/training.py` and `runtime/launch/preflight.py`, say the
same; tests/test_runnable.py holds the two together on every bundled model).

Pure functions of the architecture config and the layout: no torch.
"""

from __future__ import annotations

from octopipe.costmodel.arch import Architecture
from octopipe.plan.shape import JobShape


def context_parallel_refusal(arch: Architecture) -> str | None:
    """Why the executor cannot run `arch` with context parallelism, or None where it can (ring
    attention is built for causal self-attention with rotary or learned positions)."""
    if arch.latent_attention is not None:
        return "multi-head latent attention (MLA)"
    if arch.vision is not None or arch.cross_attention_layers:
        return "a vision tower's bidirectional attention and cross-attention layers"
    if arch.mamba is not None or (arch.hybrid_pattern and "M" in arch.hybrid_pattern):
        return "Mamba layers"
    if arch.attention.logit_softcap is not None:
        return "soft-capped attention scores"
    return None


def run_refusal(layout: JobShape, arch: Architecture, overlap_steps: bool = False) -> str | None:
    """Why `octopipe run` cannot run `layout` of `arch`, or None where it can."""
    if layout.cp > 1 and (why := context_parallel_refusal(arch)) is not None:
        return f"context parallelism does not run {why} yet"
    if layout.ep > 1 and overlap_steps:
        return "expert parallelism does not run with overlapped steps yet"
    return zero_refusal(layout, overlap_steps)


def zero_refusal(layout: JobShape, overlap_steps: bool = False) -> str | None:
    """Why `octopipe run` cannot shard `layout`'s state so, or None where it can: `--zero` 0, 1
    or 3 (FSDP2 over every DP x CP rank: no HSDP), 3 neither with EP nor with CP at TP > 1, and
    no sharding at all with overlapped steps."""
    if layout.zero == 2:
        return "ZeRO-2 is not run (--zero takes 0, 1 or 3)"
    if layout.shard_group:
        return "FSDP2 shards over every replica (no HSDP shard groups)"
    if layout.zero and overlap_steps:
        return f"ZeRO-{layout.zero} does not run with overlapped steps yet"
    if layout.zero == 3 and layout.ep > 1:
        return "ZeRO-3 (FSDP2) is not built with expert parallelism yet"
    if layout.zero == 3 and layout.cp > 1 and layout.tp > 1:
        return "ZeRO-3 (FSDP2) with CP runs at TP 1 only"
    return None
