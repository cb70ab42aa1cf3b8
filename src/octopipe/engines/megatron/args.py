"""The Megatron-LM export: a plan as the exact arguments of Megatron-LM's pretraining scripts
(`pretrain_gpt.py`), written as `megatron_args.sh`, or one line saying why Megatron-LM cannot
run it and which plan nearest to it can.

    args = megatron_arguments(plan, profile)      # list of words; InputError: cannot express
    write_megatron_args(plan, profile, path)

Target: Megatron-LM main at MEGATRON_COMMIT (Megatron-Core MEGATRON_CORE_VERSION); every
argument name below was checked against that commit's `megatron/training/arguments.py` (and
the dataclass fields its ArgumentGroupFactory turns into flags: TransformerConfig's
`tensor_model_parallel_size` is `--tensor-model-parallel-size`), and
`benchmarks/megatron_check.py` parses them with Megatron-LM's own parser.

What Megatron-LM runs: stage s on pipeline rank s mod P (V = S / P virtual stages per rank);
1F1B when V is 1, interleaved 1F1B otherwise, with full backwards (no I/W split); its own
order of those schedules, not a CSV; uneven stages through `--pipeline-model-parallel-layout`
(E the embedding, t a block, L the head and loss; the final norm lives with L); ZeRO-1 is the
distributed optimizer; recomputation is one setting for every stage.

Nothing here decides or evaluates a plan, and nothing imports torch.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from octopipe.costmodel.arch import Architecture
from octopipe.engines.answer import microbatch_size, planned_shape
from octopipe.engines.megatron.model import model_arguments, model_script
from octopipe.errors import InputError
from octopipe.outfiles import write_text
from octopipe.plan import Plan, split_backwards
from octopipe.profile import Profile

MEGATRON_COMMIT = "d98e8a64dd"  # NVIDIA/Megatron-LM main, 2026-08-22
MEGATRON_CORE_VERSION = "0.20.0"
MEGATRON_TARGET = f"Megatron-LM {MEGATRON_COMMIT} (Megatron-Core {MEGATRON_CORE_VERSION})"
ARGS_FILE = "megatron_args.sh"
LAUNCH_FILE = "megatron_launch.sh"
RUNNER_HINT = "`octopipe plan --gpus N --runner megatron` plans only what Megatron-LM runs"


def megatron_arguments(plan: Plan, profile: Profile, tp_comm_overlap: bool = False) -> list[str]:
    """Megatron-LM's pretraining arguments for `plan` (flags and values, in order), with the
    precision its profile was priced in and, where priced, TP communication overlap; an
    InputError, one line naming the nearest plan Megatron-LM runs, where it cannot."""
    shape = planned_shape(plan, profile)
    tp, dp, cp, ep, zero = shape.tp, shape.dp, shape.cp, shape.ep, shape.zero
    P, S = plan.num_devices, plan.num_stages
    _check_placement(plan)
    if split_backwards(plan):
        raise InputError(
            "plan.json",
            "schedule: Megatron-LM's schedules run whole backwards, not I/W splits; the "
            f"nearest it runs: the same {S} stages with {'interleaved ' if S > P else ''}1F1B; "
            + RUNNER_HINT,
        )
    if zero >= 2:
        raise InputError(
            "plan.json",
            f"parallelism.zero: ZeRO-{zero} is Megatron-FSDP, which this export does not "
            "write; the nearest Megatron-LM runs: ZeRO-1, its distributed optimizer; "
            + RUNNER_HINT,
        )
    b = microbatch_size(plan, profile) or 1
    blocks = [i for i, n in enumerate(profile.layer_names) if _is_block(n)]
    args = [
        *("--tensor-model-parallel-size", str(tp)),
        *("--pipeline-model-parallel-size", str(P)),
        *("--context-parallel-size", str(cp)),
    ]
    if ep > 1:  # experts not tensor-parallel under EP, as the plan priced them
        args += ["--expert-model-parallel-size", str(ep), "--expert-tensor-parallel-size", "1"]
    if tp > 1:
        args.append("--sequence-parallel")
    args += ["--num-layers", str(len(blocks))]
    args += _partition(plan, profile, blocks)
    args += ["--micro-batch-size", str(b)]
    args += ["--global-batch-size", str(dp * plan.num_microbatches * b)]
    if profile.seq_len is not None:
        args += ["--seq-length", str(profile.seq_len)]
    if zero == 1 and dp * cp > 1:
        args.append("--use-distributed-optimizer")
    if shape.rank_order == "octopipe" and shape.pp > 1 and dp > 1:
        args.append("--use-tp-pp-dp-mapping")  # tp-cp-ep-pp-dp: the plan's numbering
    args += _recomputation(plan, shape.recompute)
    args += precision_arguments(profile.precision, profile.fp8_scaling)
    if tp_comm_overlap and tp > 1:
        args.append("--tp-comm-overlap")
    return args


# Transformer Engine's recipes as Megatron-Core names them (TransformerConfig.fp8_recipe):
# OctoPipe's delayed scaling is its `delayed`, current (per-tensor, just in time) `tensorwise`.
_FP8_RECIPES = {"delayed": "delayed", "current": "tensorwise"}


def precision_arguments(precision: str, fp8_scaling: str = "delayed") -> list[str]:
    """BF16 weights and activations, and the blocks' linears in FP8 as priced
    (docs/COSTMODEL.md, "Precision"): Hopper's hybrid format (E4M3 forward, E5M2 gradients)
    with the profile's scaling; MXFP8 E4M3 with its block scales (Blackwell)."""
    if precision == "fp8":
        return ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe", _FP8_RECIPES[fp8_scaling]]
    if precision == "mxfp8":
        return ["--bf16", "--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"]
    return ["--bf16"]


def megatron_world(plan: Plan, profile: Profile) -> int:
    """GPUs one run takes: TP x CP x PP x DP."""
    return planned_shape(plan, profile).world_size


def write_megatron_args(
    plan: Plan,
    profile: Profile,
    path: str | Path,
    arch: Architecture | None = None,
    tp_comm_overlap: bool = False,
) -> None:
    """`megatron_args.sh`: a bash array MEGATRON_ARGS of the plan's arguments and, with the
    model's `arch`, its shape (`model.py`), to source and pass to Megatron-LM's pretraining
    script beside the data's and optimizer's (`write_megatron_launch`)."""
    args = megatron_arguments(plan, profile, tp_comm_overlap)
    if arch is not None:
        args += model_arguments(arch)
    lines, i = [], 0
    while i < len(args):  # a flag and its value on one line
        take = 2 if i + 1 < len(args) and not args[i + 1].startswith("--") else 1
        lines.append("    " + " ".join(shlex.quote(w) for w in args[i : i + take]))
        i += take
    rest = (
        "the data's and optimizer's" if arch is not None else "the model's, data's and optimizer's"
    )
    text = (
        "# Megatron-LM arguments for an OctoPipe plan (written by `octopipe plan`)\n"
        f"# for {MEGATRON_TARGET}: {megatron_world(plan, profile)} GPUs (TP x CP x PP x DP).\n"
        f'# source megatron_args.sh; torchrun ... pretrain_gpt.py "${{MEGATRON_ARGS[@]}}" \\\n'
        f"#     <{rest} arguments>\n"
        "MEGATRON_ARGS=(\n" + "\n".join(lines) + "\n)\n"
    )
    write_text(path, text)


def write_megatron_launch(
    plan: Plan, profile: Profile, arch: Architecture, gpus_per_node: int, path: str | Path
) -> None:
    """`megatron_launch.sh NODE_RANK`: each node's `torchrun` of the model's pretraining script
    with `megatron_args.sh`, the tokenizer, data and optimizer settings left as the variables
    it names (a run needs them; OctoPipe does not know them)."""
    world = megatron_world(plan, profile)
    per_node = min(gpus_per_node, world)
    nodes = -(-world // per_node)
    script = model_script(arch)
    text = f"""#!/usr/bin/env bash
# Megatron-LM launch for an OctoPipe plan (written by `octopipe plan`), {MEGATRON_TARGET}:
# {world} GPUs as {nodes} node(s) of {per_node}. On node r (0 to {nodes - 1}):
#     MASTER_ADDR=<node 0> MEGATRON_LM=<Megatron-LM> TOKENIZER_MODEL=<tokenizer> \\
#     DATA_PATH=<prefix> TRAIN_ITERS=<steps> LR=<peak> bash megatron_launch.sh r
set -euo pipefail
NODE_RANK=${{1:?usage: megatron_launch.sh NODE_RANK, 0 to {nodes - 1}}}
: "${{MASTER_ADDR:?the address of node 0}}" "${{MEGATRON_LM:?the folder of Megatron-LM}}"
: "${{TOKENIZER_MODEL:?the Hugging Face tokenizer}}" "${{DATA_PATH:?the data prefix}}"
: "${{TRAIN_ITERS:?optimizer steps}}" "${{LR:?the peak learning rate}}"
source "$(dirname "$0")/{ARGS_FILE}"
DATA_ARGS=(--tokenizer-type HuggingFaceTokenizer --tokenizer-model "$TOKENIZER_MODEL"
    --data-path "$DATA_PATH" --split 99,1,0)
TRAIN_ARGS=(--train-iters "$TRAIN_ITERS" --lr "$LR" --lr-decay-style cosine)
exec torchrun --nnodes {nodes} --nproc-per-node {per_node} --node-rank "$NODE_RANK" \\
    --master-addr "$MASTER_ADDR" --master-port "${{MASTER_PORT:-6000}}" \\
    "$MEGATRON_LM/{script}" "${{MEGATRON_ARGS[@]}}" "${{DATA_ARGS[@]}}" "${{TRAIN_ARGS[@]}}"
"""
    write_text(path, text)


def _is_block(name: str) -> bool:
    return name.removeprefix("model.").startswith("layers.")


def _check_placement(plan: Plan) -> None:
    """Megatron-LM places stage s on rank s mod P, the same number on every rank."""
    P, S = plan.num_devices, plan.num_stages
    looped = S % P == 0 and all(s.device == i % P for i, s in enumerate(plan.stages))
    if not looped:
        V = max(1, S // P)
        raise InputError(
            "plan.json",
            f"stages: Megatron-LM places stage s on rank s mod {P}; this plan's placement "
            f"({' '.join(str(s.device) for s in plan.stages)}) is not that; the nearest it runs: "
            f"{P * V} stages looped over {P} ranks with {'interleaved ' if V > 1 else ''}1F1B; "
            + RUNNER_HINT,
        )


def megatron_notes(plan: Plan) -> list[str]:
    """Where Megatron-LM runs an expressible plan otherwise than planned: its own order of
    (interleaved) 1F1B, where the plan's is another (a tuned order)."""
    from octopipe.schedules import generate

    P, S, M = plan.num_devices, plan.num_stages, plan.num_microbatches
    name = "i1f1b" if S > P else "1f1b"
    try:
        own = generate(name, P, M, S // P if S > P else None).orders
    except InputError as exc:
        return [f"Megatron-LM's {name} cannot run these counts as OctoPipe generates it: {exc}"]
    if all(tuple(plan.schedule[d]) == tuple(own[d]) for d in range(P)):
        return []
    return [
        f"Megatron-LM runs its own {'interleaved ' if S > P else ''}1F1B order, not this plan's "
        f"(tuned) one: its step is that schedule's; {RUNNER_HINT}."
    ]


def _partition(plan: Plan, profile: Profile, blocks: list[int]) -> list[str]:
    """The stages' blocks: `--num-virtual-stages-per-pipeline-rank` where Megatron-LM's even
    split gives them, else `--pipeline-model-parallel-layout`."""
    names = profile.layer_names
    P, S = plan.num_devices, plan.num_stages
    counts = [sum(1 for i in blocks if s.start <= i < s.end) for s in plan.stages]
    if len(blocks) % S == 0 and len(set(counts)) == 1:  # Megatron-LM's own even split
        return ["--num-virtual-stages-per-pipeline-rank", str(S // P)] if S > P else []
    stages = []
    for s in plan.stages:
        text = "".join(
            "t" if _is_block(names[i]) else "E" if i == 0 else "L" if i == len(names) - 1 else ""
            for i in range(s.start, s.end)
        )
        stages.append(text)
    return ["--pipeline-model-parallel-layout", "|".join(stages)]


def _recomputation(plan: Plan, layout_recompute: str) -> list[str]:
    """Megatron-LM's recomputation: one setting for every stage. Selective is its default
    (the attention core); full recomputes every block (uniform, 1 layer a unit)."""
    kinds = {plan.recompute_of(s) for s in range(plan.num_stages)}
    if len(kinds) > 1:
        heaviest = "full" if "full" in kinds else "selective"
        raise InputError(
            "plan.json",
            "stages[].recompute: Megatron-LM recomputes the same on every stage, this plan "
            f"recomputes in some ({', '.join(sorted(kinds))}); the nearest it runs: every stage "
            f"{heaviest}; " + RUNNER_HINT,
        )
    kind = kinds.pop()
    if kind == "none":
        kind = layout_recompute
    if kind == "selective":
        return ["--recompute-granularity", "selective"]
    if kind == "full":
        return [
            *("--recompute-granularity", "full"),
            *("--recompute-method", "uniform"),
            *("--recompute-num-layers", "1"),
        ]
    return []
