"""Do OctoPipe's Megatron-LM arguments parse in Megatron-LM? Three published layouts, each
planned as OctoPipe plans it, exported by `export.megatron`, and parsed by Megatron-LM's own
`megatron.training.arguments.parse_args` (and any pipeline layout by Megatron-Core's own
`PipelineParallelLayerLayout`), in a venv of Megatron-LM's own.

    .venv/bin/python benchmarks/megatron_check.py --megatron-venv VENV --megatron-src DIR

Not run in CI. VENV holds torch, triton, numpy and packaging (`python3 -m venv VENV &&
VENV/bin/pip install torch triton numpy packaging`); DIR holds Megatron-LM's source at the
commit `export.megatron.MEGATRON_COMMIT` (`git archive <commit> megatron | tar -x -C DIR`).
One shim, only here: Megatron-LM at that commit imports `typing.override` (Python 3.12);
under Python 3.11 the script gives it `typing_extensions.override`, the same decorator.

Layouts (sources in the table): Llama 3 405B as Meta trained it (Llama 3 paper, Table 4: TP 8,
CP 1, PP 16, DP 64 at 8,192 tokens, interleaved, first and last stages with fewer layers);
Llama 3 70B as NeMo's recipe (TP 4, PP 4, CP 2, virtual stages 5, 8,192 tokens); Mixtral 8x7B
as NeMo's recipe (TP 1, PP 4, EP 8, virtual stages 8, 4,096 tokens).

Then the answers of `plan --gpus --runner megatron --precision fp8` for a model of every family
the export writes (`ANSWERS`: dense, MoE with and without shared experts, MLA, Nemotron-H's
hybrid, GPT), exported and parsed the same way: what the search prints for Megatron-LM must be
what Megatron-LM takes. Every case carries the model's shape (`engines/megatron/model.py`),
and the parameters those parsed arguments build (`megatron_parameters` on the parser's own
namespace) must equal OctoPipe's count of the config.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

# name, model, TP, CP, PP, DP, EP, V, partition, seq, microbatches, recompute, source
LAYOUTS = [
    ("llama3-405b 16K GPUs", "llama3-405b", 8, 1, 16, 64, 1, 2, "balanced", 8192, 32, "none",
     "Llama 3 paper (arXiv 2407.21783), Table 4"),
    ("llama3-70b NeMo", "llama3-70b", 4, 2, 4, 2, 1, 5, "uniform", 8192, 20, "selective",
     "NeMo llama3_70b pretrain recipe"),
    ("mixtral-8x7b NeMo", "mixtral-8x7b", 1, 1, 4, 8, 8, 8, "uniform", 4096, 32, "full",
     "NeMo mixtral_8x7b pretrain recipe"),
]  # fmt: skip

# model, GPUs, GPUs per node, global batch, sequence length: `plan --gpus --runner megatron`
ANSWERS = [
    ("llama3-8b", 16, 8, 128, 4096),  # issue 31's example job
    ("llama3-70b", 64, 8, 512, 4096),
    ("mixtral-8x7b", 64, 8, 256, 4096),
    # a model of every family the export writes: MoE with shared experts, MLA, Mamba, GPT
    ("qwen1.5-moe-a2.7b", 16, 8, 128, 4096),
    ("deepseek-v2-lite", 16, 8, 128, 4096),
    ("nemotron-h-8b", 16, 8, 128, 4096),
    ("benchmarks/data/configs/gpt3-5b.json", 16, 8, 128, 2048),
    ("benchmarks/data/configs/qwen3-30b-a3b.json", 32, 8, 256, 4096),
]

PARSE = r"""
import json, sys, typing, typing_extensions
typing.override = typing_extensions.override  # Megatron-LM wants Python 3.12's
args = json.loads(sys.argv[1])
sys.argv = ["pretrain_gpt.py", *args]
from megatron.training.arguments import parse_args
parsed = parse_args()
def plain(v):
    return v if isinstance(v, (int, float, str, bool, type(None))) else str(v)
out = {k: plain(v) for k, v in vars(parsed).items()}
if parsed.pipeline_model_parallel_layout:
    from megatron.core.transformer.pipeline_parallel_layer_layout import (
        PipelineParallelLayerLayout as Layout)
    layout = Layout(parsed.pipeline_model_parallel_layout, parsed.pipeline_model_parallel_size)
    layout.validate_layer_layout(num_layers=parsed.num_layers, mtp_num_layers=None)
    out["layout_stages"] = len(Layout.parse_str_to_list(parsed.pipeline_model_parallel_layout))
print("OCTOPIPE-PARSED " + json.dumps(out))
"""


def plan_of(model, tp, cp, pp, dp, ep, v, partition, seq, m, recompute):
    from octopipe.api import baseline
    from octopipe.layouts import Cluster, Job, LayoutSearch, parse_gpus
    from octopipe.plan import JobShape

    cluster = Cluster(parse_gpus(str(tp * cp * pp * dp)), 8)
    job = Job(model, cluster, global_batch=dp * m, seq_len=seq)
    layout = JobShape(tp, pp, dp, 1, m, zero=1, cp=cp, recompute=recompute, ep=ep)
    profile, _ = LayoutSearch(job).profile(layout)
    plan = baseline(profile, "i1f1b", partition, m, pp, v)
    plan = plan.with_shape(layout)
    return plan.with_layer_names(profile.layer_names), profile


def answer_of(model, gpus, per_node, batch, seq):
    """`plan --gpus --runner megatron`'s answer for the job (in FP8), as the command writes it."""
    from octopipe.layouts import Cluster, Job, parse_gpus
    from octopipe.layouts.search import plan_cluster, written_plan
    from octopipe.layouts.stack import Stack

    stack = Stack(precision="fp8")
    job = Job(model, Cluster(parse_gpus(str(gpus)), per_node), batch, seq, stack)
    best = plan_cluster(job, runner="megatron", time_budget=20).best
    name = f"{Path(model).name.removesuffix('.json')} on {gpus} GPUs: {best.layout.describe()}"
    source = (
        f"plan --gpus {gpus} --runner megatron --global-batch {batch} --seq-len {seq} "
        "--precision fp8"
    )
    return name, source, written_plan(best), best.profile, model


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--megatron-venv", type=Path, required=True)
    p.add_argument("--megatron-src", type=Path, required=True)
    a = p.parse_args()
    from octopipe.costmodel import load_architecture
    from octopipe.costmodel.build import parameter_count
    from octopipe.engines.megatron import MEGATRON_TARGET, megatron_arguments
    from octopipe.engines.megatron.model import (
        megatron_parameters,
        megatron_values,
        model_arguments,
    )

    python = a.megatron_venv.resolve() / "bin" / "python"
    print(f"{MEGATRON_TARGET}, parsed by its megatron.training.arguments.parse_args\n")
    print("| layout | source | arguments (OctoPipe's export) | parsed | same |")
    print("|---|---|---|---|---|")
    cases = [
        (name, source, *plan_of(model, tp, cp, pp, dp, ep, v, part, seq, m, rec), model)
        for name, model, tp, cp, pp, dp, ep, v, part, seq, m, rec, source in LAYOUTS
    ]
    cases += [answer_of(*job) for job in ANSWERS]
    good = True
    counts = []
    for name, source, plan, profile, model in cases:
        arch = load_architecture(model)
        args = megatron_arguments(plan, profile) + model_arguments(arch)
        done = subprocess.run(
            [str(python), "-c", PARSE, json.dumps(args)],
            capture_output=True,
            text=True,
            env={"PYTHONPATH": str(a.megatron_src.resolve()), "PATH": "/usr/bin:/bin"},
        )
        line = next((x for x in done.stdout.splitlines() if x.startswith("OCTOPIPE-PARSED")), "")
        if not line:
            err = (done.stderr.strip().splitlines() or ["no output"])[-1]
            print(f"| {name} | {source} | `{' '.join(args)}` | FAILED: {err} | NO |")
            good = False
            continue
        parsed = json.loads(line.split(" ", 1)[1])
        same = _agrees(args, parsed)
        built, counted = megatron_parameters(parsed), parameter_count(arch)
        counts.append((name, built, counted))
        good &= same and built == counted
        written = megatron_values(args)
        shown = ", ".join(f"{k}={parsed[k]}" for k in written if k in parsed)
        print(f"| {name} | {source} | `{' '.join(args)}` | {shown} | {'yes' if same else 'NO'} |")
    print(
        "\n| layout | parameters Megatron-LM builds (from its parsed arguments) "
        "| OctoPipe's count of the config | equal |"
    )
    print("|---|---|---|---|")
    for name, built, counted in counts:
        print(f"| {name} | {built:,} | {counted:,} | {'yes' if built == counted else 'NO'} |")
    return 0 if good else 1


def _agrees(args: list[str], parsed: dict) -> bool:
    """Every flag's value reads back as written (a switch as its attribute's True or False; a
    list or tuple as its text without spaces)."""
    from octopipe.engines.megatron.model import megatron_values

    for key, value in megatron_values(args).items():
        got = parsed.get(key)
        if isinstance(value, bool):
            if got is not value:
                return False
        elif str(got).replace(" ", "") != value.replace(" ", ""):
            return False
    return True


if __name__ == "__main__":
    sys.exit(main())
