"""A torchtitan 0.3.x job config that runs an OctoPipe plan.

`octopipe plan` writes this file beside the plan as `octopipe_torchtitan.py`, with the plan's
settings filled in between the two marker lines below (everything else is as shipped). Launch it
with the LAUNCH command (PYTHONPATH names this folder, so torchtitan's `--module
octopipe_torchtitan` finds it); `--section.key value` flags after that command override any
setting, as with torchtitan's own configs.

torchtitan 0.3 takes its configs as Python functions (`--module M --config F`). The function
here, `octopipe_plan`, starts from the torchtitan config BASE_MODULE.BASE_CONFIG and sets what
the plan decided: the pipeline degree, each stage's module FQNs, the schedule CSV (an absolute
path), the microbatch size and count, the tensor-, context-, expert- and data-parallel degrees
(dp_replicate x dp_shard), the sequence length, the activation checkpointing (none, selective or
full, for every block), the precision (FP8 or MXFP8 converters, as priced) and what a pipeline
needs in 0.3: no CUDA graphs. It then checks the
stages' module names against the model torchtitan builds from that config (on the meta
device): a name the model lacks, or a module with weights in no stage, stops the launch instead
of training another model; so does a sequence length that torchtitan's context parallelism
cannot cut for that model's attention. For a placement torchtitan's own loop and V cannot
express (PLACEMENT "free"), it installs octopipe_torchtitan_stages.py,
which places the stages as the CSV does.

Ranks: torchtitan numbers them with PP outermost (its mesh: pp, dp_replicate, dp_shard, cp, tp),
where OctoPipe's executor puts DP outermost (tp, cp, pp, dp); the two agree when dp is 1.
"""

from __future__ import annotations

import importlib

# --- the plan's settings (written by `octopipe plan`) ---
LAUNCH = ""
PROFILE = ""
BASE_MODULE = ""
BASE_CONFIG = ""
SCHEDULE_CSV = ""
PLACEMENT = "loop"
PARALLELISM: dict = {}
TRAINING: dict = {}
ACTIVATION_CHECKPOINTING = "none"
PRECISION = "bf16"
# --- end of the plan's settings ---


def octopipe_plan():
    """The base config with the plan's settings, checked against its model (torchtitan calls
    this for `--config octopipe_plan`, once in every rank's process)."""
    config = getattr(importlib.import_module(BASE_MODULE), BASE_CONFIG)()
    apply_plan(config)
    check_stage_modules(model_modules(config), PARALLELISM["module_fqns_per_model_part"])
    check_context_parallel(config)
    if PLACEMENT == "free":
        import octopipe_torchtitan_stages  # beside this file, so on the same path

        octopipe_torchtitan_stages.install(SCHEDULE_CSV)
    return config


def apply_plan(config) -> None:
    """Set the plan's settings on a torchtitan `Trainer.Config` (in place)."""
    for section, settings in (("parallelism", PARALLELISM), ("training", TRAINING)):
        target = getattr(config, section)
        for key, value in settings.items():
            if not hasattr(target, key):  # another torchtitan version: say so, do not guess
                raise AttributeError(
                    f"octopipe_torchtitan.py: torchtitan's {section} has no {key!r}; this file "
                    "is for torchtitan 0.3.x"
                )
            setattr(target, key, value)
    config.activation_checkpoint = checkpointing(ACTIVATION_CHECKPOINTING)
    for converter in quantization(PRECISION):
        config.model_spec.model = converter.build().convert(config.model_spec.model)


def quantization(precision: str) -> list:
    """torchtitan 0.3's converters for the precision the plan was priced in: its blocks' linears
    and expert GEMMs in FP8 (rowwise scaling, computed at each cast: the cost model's current
    scaling) or MXFP8 (Blackwell); the output head stays BF16, as priced."""
    if precision == "bf16":
        return []
    from torchtitan.components import quantization as q

    if precision == "fp8":
        return [
            q.Float8LinearConverter.Config(recipe_name="rowwise", filter_fqns=["output"]),
            q.Float8GroupedExpertsConverter.Config(),
        ]
    return [q.MXFP8LinearConverter.Config(fqns=["layers"]), q.MXFP8GroupedExpertsConverter.Config()]


def checkpointing(kind: str):
    """torchtitan 0.3's activation-checkpointing config for "none", "selective" or "full"."""
    if kind == "none":
        return None
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    return {"selective": SelectiveAC, "full": FullAC}[kind].Config()


def model_modules(config) -> dict[str, bool]:
    """The names torchtitan's pipeline split cuts the model by (each top-level module, and each
    entry of a top-level ModuleDict/ModuleList), with whether each holds parameters."""
    import torch

    with torch.device("meta"):  # no memory: only the structure is read
        model = config.model_spec.model.build()
    out: dict[str, bool] = {}
    for name, child in model.named_children():
        if isinstance(child, (torch.nn.ModuleDict, torch.nn.ModuleList)):
            for key, entry in child.named_children():
                out[f"{name}.{key}"] = any(True for _ in entry.parameters())
        else:
            out[name] = any(True for _ in child.parameters())
    return out


def check_stage_modules(modules: dict[str, bool], stages: list[list[str]]) -> None:
    """Every stage module exists in the model, once; every module with weights is in a stage
    (torchtitan's split would silently drop it). A fault is one ValueError line."""
    seen: set[str] = set()
    for i, names in enumerate(stages):
        for name in names:
            if name not in modules:
                raise ValueError(
                    f"octopipe_torchtitan.py: stage {i} names {name!r}, which the model of "
                    f"{BASE_MODULE}.{BASE_CONFIG} does not have (its modules: "
                    f"{', '.join(modules)})"
                )
            if name in seen:
                raise ValueError(f"octopipe_torchtitan.py: {name!r} is in two stages")
            seen.add(name)
    dropped = [name for name, weighted in modules.items() if weighted and name not in seen]
    if dropped:
        raise ValueError(
            f"octopipe_torchtitan.py: the model of {BASE_MODULE}.{BASE_CONFIG} has "
            f"{dropped[0]!r}, which no stage holds ({len(dropped)} such modules); the plan is "
            "for another model"
        )


FLEX_BLOCK = 128  # torch's default BlockMask block (flex_attention._DEFAULT_SPARSE_BLOCK_SIZE)


def check_context_parallel(config) -> None:
    """torchtitan 0.3's CP cuts every sequence into equal parts, one per CP rank, by the model's
    attention: FlexAttention (its llama3 models' default) in blocks of 128 tokens per rank, so
    the sequence length must be a multiple of CP x 128; SDPA's head-tail balancing in 2 x CP
    parts; variable-length attention not at all. torchtitan finds out at the first step (a
    NotImplementedError, or a bare AssertionError for SDPA); this is one ValueError line before
    anything starts. The model is built on the meta device, and only under CP."""
    cp = config.parallelism.context_parallel_degree
    if cp == 1:
        return
    import torch

    with torch.device("meta"):
        model = config.model_spec.model.build()
    kinds = {type(m).__name__ for m in model.modules()}
    seq_len = config.training.seq_len
    where = f"octopipe_torchtitan.py: context parallelism (CP {cp}) of {BASE_MODULE}.{BASE_CONFIG}"
    if "VarlenAttention" in kinds:
        raise ValueError(f"{where}: torchtitan 0.3 has no CP for variable-length attention")
    if "FlexAttention" in kinds:
        unit, how = cp * FLEX_BLOCK, f"FlexAttention's blocks of {FLEX_BLOCK} tokens per rank"
    elif "ScaledDotProductAttention" in kinds:
        unit, how = 2 * cp, "SDPA's head-tail balancing in 2 x CP parts"
    else:
        return
    if seq_len % unit:
        raise ValueError(
            f"{where}: torchtitan cuts each sequence by {how}, so training.seq_len must be a "
            f"multiple of {unit}, not {seq_len}"
        )
