"""OctoPipe's own executor (`octopipe run`): every schedule, placement and partition; what it
refuses of a shape, each rule stated once (the search keeps to them, `octopipe run` refuses by
them before any rank starts); the `torchrun` lines that launch a written plan.

Its ZeRO-3 (FSDP2 over all DP x CP ranks) holds a stage's gathered weights and gradients across
the step, so it is priced exactly as ZeRO-1 (the same peak, one gather and one reduce-scatter a
step): the search offers ZeRO-1 in its place rather than screen every shape twice
(tests/test_plan_runners.py holds the prices equal). Its answers carry torchtitan's export too
(a plan's CSV runs there). Pure functions of the shape and the architecture config: no torch.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from octopipe.engines.base import Engine, Refusal
from octopipe.errors import InputError
from octopipe.plan import JobShape

if TYPE_CHECKING:
    from octopipe.costmodel.arch import Architecture
    from octopipe.engines.answer import Answer
    from octopipe.layouts.layout import Job

RUN_ZERO_STAGES = (0, 1, 3)  # `octopipe run --zero`: ZeRO-1, FSDP2, or neither


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


def shape_refusal(
    shape: JobShape, overlap_steps: bool = False, precision: str = "bf16"
) -> Refusal | None:
    """Why `octopipe run` cannot run `shape` (with overlapped steps, in `precision`), whatever
    the model, or None where it can: the one statement of each rule."""
    tp, cp, ep, zero = shape.tp, shape.cp, shape.ep, shape.zero
    if precision == "mxfp8":
        return Refusal("--precision", "octopipe run trains FP8 (torchao's float8), not MXFP8")
    if precision == "fp8" and tp > 1:
        return Refusal("--tp", f"{tp} with FP8 is not built yet (FP8 runs at --tp 1)")
    if precision == "fp8" and zero == 3:
        return Refusal("--zero", "3 with FP8 is not built yet (FP8 runs at ZeRO-0 and ZeRO-1)")
    if zero not in RUN_ZERO_STAGES:
        return Refusal("--zero", f"{zero} is not run: --zero takes 0, 1 or 3")
    if shape.shard_group:
        return Refusal(
            "--zero",
            f"3 shards over every replica; the plan's HSDP shard groups of {shape.shard_group} "
            "are not run (plan it with --runner octopipe, or run it in torchtitan)",
        )
    if zero and overlap_steps:
        return Refusal("--zero", "not supported with --overlap-steps yet")
    if ep > 1 and shape.stage_ranks % ep:
        ranks = shape.stage_ranks
        return Refusal("--ep", f"{ep} does not divide a device's TP x CP x DP = {ranks} ranks")
    if zero == 3 and ep > 1:
        return Refusal("--zero", f"3 is not built with expert parallelism yet (--ep {ep})")
    if zero == 3 and cp > 1 and tp > 1:
        return Refusal(
            "--zero",
            f"3 with --cp {cp} and --tp {tp} is not built yet (FSDP2 over the replicas' and CP "
            "ranks needs their mesh and TP's from one root); --zero 3 runs with --cp at --tp 1",
        )
    if ep > 1 and overlap_steps:
        return Refusal("--overlap-steps", "not built with expert parallelism yet")
    return None


def run_refusal(
    shape: JobShape, arch: Architecture | None, overlap_steps: bool = False, precision: str = "bf16"
) -> Refusal | None:
    """Why `octopipe run` cannot run `shape` of `arch`, or None where it can."""
    if shape.cp > 1 and arch is not None and (why := context_parallel_refusal(arch)) is not None:
        return Refusal("--cp", f"context parallelism does not run {why} yet")
    return shape_refusal(shape, overlap_steps, precision)


@dataclass(frozen=True)
class OctoPipeEngine(Engine):
    name: str = "octopipe"
    title: str = "octopipe run"
    overlaps_steps: bool = True
    rank_orders: tuple[str, ...] = ("octopipe", "megatron")  # its mesh is built in either
    accepts: tuple[str, ...] = ("torchtitan", "megatron")
    companions: tuple[str, ...] = ("torchtitan",)

    def refuse(
        self,
        shape: JobShape,
        arch: Architecture | None,
        overlap_steps: bool = False,
        precision: str = "bf16",
    ) -> str | None:
        refusal = run_refusal(shape, arch, overlap_steps, precision)
        return None if refusal is None else str(refusal)

    def price(self, job: Job) -> Job:
        """Its FSDP2 holds a stage's gathered weights across the step's microbatches even
        without PP (`runtime/parallel/fsdp.py`); its FP8 is torchao's float8 with per-tensor
        scales computed at each cast (current scaling), and it has no MXFP8; its tensor
        parallelism (torch's) keeps a column-parallel linear's gathered input. Not priced yet:
        its BF16 is autocast over FP32 weights, each microbatch keeping its own BF16 weight
        copies (`Settings.weight_copies`, measured by benchmarks/bench_high_water.py), which the
        executor should cast once a step instead."""
        if job.stack.precision == "mxfp8":
            raise InputError(
                "--precision",
                "octopipe run trains FP8 through torchao's float8 (--precision fp8), not MXFP8; "
                "MXFP8 is priced for --runner torchtitan or megatron",
            )
        scaling = "current" if job.stack.precision == "fp8" else job.stack.fp8_scaling
        return self._with_stack(job, zero3_held=True, fp8_scaling=scaling, tp_keeps_gathered=True)

    def launch(self, answer: Answer, out: Path) -> list[str]:
        """`torchrun` on every node, for `octopipe run` of the written plan: each rank takes its
        place from the plan's shape (docs/FORMATS.md, `parallelism`). None for a plan without
        one (a single pipeline)."""
        if answer.plan.shape is None:
            return []
        shape = answer.plan.shape
        world = shape.world_size
        per_node = min(world, answer.gpus_per_node or world)
        nodes = max(1, world // per_node)
        # Both paths absolute, so the line runs from any folder; on several nodes each needs
        # them at the same place (the note below says so).
        run = ["-m", "octopipe", "run", "--plan", str((out / "plan.json").resolve())]
        run += ["--model", _absolute_if_file(answer.model)]
        if answer.seq_len is not None:
            run += ["--seq-len", str(answer.seq_len)]
        if shape.zero:
            run += ["--zero", str(shape.zero)]
        if answer.overlap_steps:  # the plan was ranked by its steady step, steps back to back
            run.append("--overlap-steps")
        if nodes == 1:
            head = ["torchrun", "--standalone", "--nproc-per-node", str(per_node)]
            notes = []
        else:
            head = ["torchrun", "--nnodes", str(nodes), "--nproc-per-node", str(per_node)]
            head += ["--node-rank", "$NODE_RANK", "--rdzv-backend", "c10d"]
            head += ["--rdzv-endpoint", "$MASTER_ADDR:29500"]
            notes = [
                f"(on each of the {nodes} nodes, NODE_RANK 0..{nodes - 1}, MASTER_ADDR node 0's; "
                "each node needs the plan's folder, and the model's config if a file, at the "
                "paths above)"
            ]
        words = [w if w.startswith("$") else shlex.quote(w) for w in [*head, *run]]
        return ["to run it:", f"  {' '.join(words)}", *(f"  {n}" for n in notes)]


def _absolute_if_file(model: str) -> str:
    """A model given as a config file's path, made absolute; a shipped model's name as it is."""
    path = Path(model)
    return str(path.resolve()) if path.exists() else model
