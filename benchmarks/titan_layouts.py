"""The cluster side of `titan_check.py`: answers of `octopipe plan --gpus` (DP x PP) and layouts
with CP and HSDP, trained in torchtitan 0.3 by the launch command OctoPipe prints, with the
device mesh, batch sizes and stage map torchtitan built set against the plan's.

Used by titan_check.py (which installs the CPU shims and runs the commands); runs in OctoPipe's
venv. What torchtitan built is read from its log: `Building device mesh with parallelism: pp=..,
dp_replicate=.., dp_shard=.., cp=.., tp=.., ep=..`, `Applied FSDP|HSDP to the model`, `Trainer
is initialized with local batch size L, global batch size G, gradient accumulation steps A`,
`PP rank R is building stage_idx S`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import titan_check as tc

# `octopipe plan --gpus` answers for the debug model at 128 tokens: 4 GPUs, each the planner's
# own choice of DP 2 x PP 2 (on one node of 4 it keeps ZeRO-1, which torchtitan runs as FSDP;
# on two nodes of 2, whole replicas).
ANSWERS = [
    ("plan --gpus 4, 1 node of 4, batch 24", ["--gpus", "4", "--gpus-per-node", "4"], 24),
    ("plan --gpus 4, 2 nodes of 2, batch 48", ["--gpus", "4", "--gpus-per-node", "2"], 48),
]
# Layouts the debug model's answers do not pick, set on a 1F1B plan of 2 stages (4 microbatches):
# (name, tokens per sample, parallelism). torchtitan's CP with FlexAttention (the llama3
# models' attention in 0.3) shards a sequence in blocks of 128 tokens per CP rank.
LAYOUTS = [
    ("1F1B, CP 2 x PP 2, 256 tokens", 256, {"cp": 2}),
    ("1F1B, PP 2 x HSDP 2 x 2 (ZeRO-3, groups of 2)", 128, {"dp": 4, "zero": 3, "group": 2}),
]
# A layout torchtitan cannot run: it must fail in one line, before training.
REFUSED = ("1F1B, CP 2 x PP 2, 128 tokens", 128, {"cp": 2})
AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp", "ep")
_MESH = re.compile(
    r"Building device mesh with parallelism: " + ", ".join(rf"{a}=(\d+)" for a in AXES)
)
_SHARDING = re.compile(r"Applied (FSDP|HSDP) to the model")
_PLACED = re.compile(
    r"octopipe-check: rank (\d+) node (\d+) pp (\d+) batch (\d+) cp (\d+) tp (\d+)"
)
_BATCH = re.compile(
    r"local batch size (\d+), global batch size (\d+), gradient accumulation steps (\d+)"
)


def install_mesh_report() -> None:
    """Run in torchtitan's processes beside titan_check's shims, but not a shim: each rank
    prints where torchtitan put it once its mesh is built (its node, torchrun's GROUP_RANK, and
    its coordinate on the mesh pp x batch x cp x tp), which torchtitan's own log does not say."""
    from torchtitan.distributed.parallel_dims import ParallelDims

    build_mesh = ParallelDims.build_mesh

    def reported(self):
        mesh = build_mesh(self)
        pp, batch, cp, tp = self._global_meshes["dataloading"].get_coordinate()
        print(
            f"octopipe-check: rank {os.environ['RANK']} node {os.environ['GROUP_RANK']} "
            f"pp {pp} batch {batch} cp {cp} tp {tp}",
            flush=True,
        )
        return mesh

    ParallelDims.build_mesh = reported


@dataclass
class LayoutRun:
    name: str
    launch: str  # nodes x processes, as the command says
    planned: dict[str, int]  # the mesh the export asked for
    built: dict[str, int]  # as torchtitan logged it
    sharding: str  # torchtitan's data-parallel wrapping, from its log
    batch_planned: tuple[int, int, int]  # local, global, gradient accumulation
    batch_built: tuple[int, int, int] | None
    placement: tuple[int, ...]
    stages_built: dict[int, int]
    ranks_planned: dict[int, tuple[int, int, int, int, int]]  # rank -> node, pp, dp, cp, tp
    ranks_built: dict[int, tuple[int, int, int, int, int]]
    losses: list[float]
    seconds: float
    error: str | None

    @property
    def matches(self) -> bool:
        same_stages = self.stages_built == dict(enumerate(self.placement))
        same = self.built == self.planned and self.batch_built == self.batch_planned
        return self.error is None and same and same_stages


def export_answer(model: Path, flags: list[str], batch: int, folder: Path):
    """`octopipe plan --gpus` as a user runs it; the plan, its profile and the printed command."""
    from octopipe.plan import load_plan
    from octopipe.profile import load_profile

    argv = ["plan", "--model", str(model), "--seq-len", str(tc.SEQ_LEN), *flags]
    argv += ["--global-batch", str(batch), "--torchtitan-config", tc.BASE]
    argv += ["--no-png", "--quiet", "-o", str(folder)]
    done = subprocess.run(
        [sys.executable, "-m", "octopipe", *argv], capture_output=True, text=True, check=True
    )
    lines = done.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("torchtitan 0.3"))
    profile = load_profile(folder / "profile.json")
    return load_plan(folder / "plan.json", profile.num_layers), profile, lines[at + 1].strip()


def export_layout(seq_len: int, par: dict, folder: Path):
    """A 1F1B plan of the debug model with the layout `par`, exported as `octopipe plan`
    exports a plan; the plan, its profile and its launch command."""
    from octopipe.api import baseline, profile_from_config
    from octopipe.engines import Answer, Exports, get_engine
    from octopipe.engines.files import write_answer
    from octopipe.engines.torchtitan import torchtitan_launch_command
    from octopipe.engines.torchtitan.layout import titan_layout

    folder.mkdir(parents=True)
    config = folder / "llama3_debugmodel.json"
    config.write_text(__import__("json").dumps(tc.DEBUG_MODEL))
    profile = profile_from_config(str(config), devices=tc.DEVICES, seq_len=seq_len)
    plan = baseline(profile, "1f1b", "uniform", tc.MICROBATCHES, tc.DEVICES)
    plan = plan.with_shape(  # HSDP's "group": docs/FORMATS.md, parallelism.shard_group
        tp=1,
        dp=par.get("dp", 1),
        microbatch_size=1,
        zero=par.get("zero", 0),
        cp=par.get("cp", 1),
        shard_group=par.get("group", 0),
    )
    answer = Answer(plan, profile, str(config), exports=Exports(torchtitan_config=tc.BASE))
    write_answer(get_engine("torchtitan"), answer, folder, pictures=False)
    return plan, profile, torchtitan_launch_command(folder, titan_layout(plan, profile).world)


def train_layout(name, plan, profile, command, start, paths, venv, work, steps) -> LayoutRun:
    from octopipe.engines.torchtitan.layout import titan_layout

    lay = titan_layout(plan, profile)
    tag = re.sub(r"\W+", "-", name).strip("-")
    text, code, seconds = tc.launch_steps(command, tag, start, paths, venv, work, steps)
    stages, losses = tc.parse_log(text)
    mesh = _MESH.search(text)
    sharding = _SHARDING.search(text)
    batch = _BATCH.search(text)
    nodes = re.search(r"--nnodes (\d+) --nproc-per-node (\d+)", command)
    per_node = int(re.search(r"--nproc-per-node (\d+)", command).group(1))
    return LayoutRun(
        name=name,
        launch=f"{nodes.group(1)} x {per_node}" if nodes else f"1 x {per_node}",
        planned={a: getattr(lay, a) for a in AXES},
        built=dict(zip(AXES, map(int, mesh.groups()))) if mesh else {},
        sharding=sharding.group(1) if sharding else "-",
        batch_planned=(lay.local_batch_size, lay.global_batch_size, lay.accumulation),
        batch_built=tuple(map(int, batch.groups())) if batch else None,  # type: ignore[arg-type]
        placement=plan.placement,
        stages_built=stages,
        ranks_planned=planned_ranks(lay, per_node),
        ranks_built={int(g[0]): tuple(map(int, g[1:])) for g in _PLACED.findall(text)},
        losses=losses,
        seconds=seconds,
        error=tc.run_error(text, code, losses, steps),
    )


def planned_ranks(lay, per_node: int) -> dict[int, tuple[int, int, int, int, int]]:
    """Each rank's node and (pp, dp, cp, tp) coordinate as the plan numbers its GPUs: TP
    fastest, then CP, PP, DP (docs/FORMATS.md); torchrun puts rank g on node g // per_node."""
    out = {}
    for g in range(lay.world):
        t, rest = g % lay.tp, g // lay.tp
        c, rest = rest % lay.cp, rest // lay.cp
        out[g] = (g // per_node, rest % lay.pp, rest // lay.pp, c, t)
    return out


def pp_hops_across_nodes(ranks: dict[int, tuple[int, int, int, int, int]]) -> int:
    """Pipeline neighbours (same dp, cp, tp; pp p and p + 1) on different nodes."""
    node_at = {coord[1:]: coord[0] for coord in ranks.values()}
    return sum(
        node != node_at.get((pp + 1, dp, cp, tp), node)
        for (pp, dp, cp, tp), node in node_at.items()
    )


def _ranks(r: dict[int, tuple[int, int, int, int, int]]) -> str:
    """Each rank's pipeline stage (pp coordinate), ranks in order; nodes split by ";"."""
    if not r:
        return "-"
    out = ""
    for g in sorted(r):
        if g and r[g][0] != r[g - 1][0]:
            out += ";"
        out += f" {r[g][1]}"
    return out.strip()


def _mesh(m: dict[str, int]) -> str:
    return " ".join(f"{a} {m[a]}" for a in AXES if a != "ep" or m[a] != 1) if m else "-"


def layout_table(runs: list[LayoutRun]) -> str:
    rows = [
        "| plan | nodes x procs | mesh planned | mesh torchtitan built | data parallel built | "
        "batch local/global/accum, planned -> built | stage -> PP rank as planned | same | "
        "pp of rank 0.. (nodes split by ;), planned -> built | PP hops across nodes, "
        "planned -> built | loss per step | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---:|",
    ]
    for r in runs:
        built = "/".join(map(str, r.batch_built)) if r.batch_built else "-"
        batch = f"{'/'.join(map(str, r.batch_planned))} -> {built}"
        stages = " ".join(f"{s}:{d}" for s, d in enumerate(r.placement))
        if r.stages_built:
            stages += " (yes)" if r.stages_built == dict(enumerate(r.placement)) else " (NO)"
        refused = r.error is not None and not r.built  # stopped before building a mesh
        losses = ", ".join(f"{x:.4f}" for x in r.losses) if r.error is None else r.error
        rows.append(
            f"| {r.name} | {r.launch} | {_mesh(r.planned)} | {_mesh(r.built)} | {r.sharding} | "
            f"{batch} | {stages} | {'yes' if r.matches else 'refused' if refused else 'NO'} | "
            f"{_ranks(r.ranks_planned)} -> {_ranks(r.ranks_built)} | "
            f"{pp_hops_across_nodes(r.ranks_planned)} -> "
            f"{pp_hops_across_nodes(r.ranks_built) if r.ranks_built else '-'} | {losses} | "
            f"{r.seconds:.0f} |"
        )
    return "\n".join(rows)


def check_layouts(work: Path, start: Path, paths, venv: Path, steps: int) -> tuple[list, bool]:
    """Every answer and layout above, exported, launched and compared; whether all trained as
    planned and the refused layout was refused."""
    model = work / "llama3_debugmodel.json"  # written by titan_check.debug_profile
    exports = [
        (name, *export_answer(model, flags, batch, work / f"gpus{i}"))
        for i, (name, flags, batch) in enumerate(ANSWERS)
    ]
    exports += [
        (name, *export_layout(seq, par, work / f"layout{i}"))
        for i, (name, seq, par) in enumerate([*LAYOUTS, REFUSED])
    ]
    runs = [train_layout(*e, start, paths, venv, work, steps) for e in exports]
    good = all(r.matches for r in runs[:-1]) and runs[-1].error is not None
    return runs, good
