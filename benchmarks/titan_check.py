"""Does OctoPipe's torchtitan 0.3 export train as written? Loop, V and free placements of
torchtitan's own debug model on 2 ranks, and `plan --gpus` answers of DP x PP (with CP and HSDP
layouts) on 4 to 8, 2 steps each, on CPU with gloo.

    .venv/bin/python benchmarks/titan_check.py --titan-venv VENV --tokenizer DIR

Not run in CI: it needs a virtual environment of its own holding torch 2.14 and torchtitan
0.3.0 (`python3 -m venv VENV && VENV/bin/pip install torch==2.14.1 torchtitan==0.3.0`; torchtitan
0.3.0 calls `PipelineScheduleMulti.step(arg_mbs=...)`, which torch 2.13 lacks), and torchtitan's
test tokenizer (`tests/assets/tokenizer` of torchtitan's repository; the wheel lacks it). This
script itself runs in OctoPipe's venv.

What it does, for `llama3_debugmodel` (6 blocks, dim 256, 16 heads, vocabulary 2048; its
profile comes from OctoPipe's cost model, 128 tokens):

1. three plans on two devices, 4 microbatches: the loop (interleaved 1F1B), the V (ZB-V, split
   backward) and the tuner's plan for devices of speeds 1.0 and 0.7, whose placement is neither
   (`octopipe plan`, run as a user runs it). Each is exported as `octopipe plan` exports it, and
   the launch command OctoPipe prints is run as printed, with only `--training.steps`, the seed,
   the timeouts and the dump folder appended (the tokenizer and data paths go in the variables
   the command asks for, $TORCHTITAN_ASSETS and $TORCHTITAN_DATA); from torchtitan's log it
   reads the stages each rank built and the losses, and compares the built map with the plan's.
2. cluster layouts (`titan_layouts.py`): `octopipe plan --gpus 4` answers that are DP 2 x PP 2
   (one node of 4: ZeRO-1, run by torchtitan as FSDP; two nodes of 2: whole replicas, the
   command run once per node on this machine), and 1F1B plans with CP 2 x PP 2 and with
   PP 2 x HSDP 2 x 2; the mesh, batch sizes, stage map and each rank's place that torchtitan
   built are set against the plan's. A CP 2 plan at 128 tokens, which torchtitan's CP cannot
   cut, must be refused.
3. torchtitan's own configs: the exports for OctoPipe's llama3-8b and llama3-70b profiles, and
   one for the debug model started from the wrong base (llama3_8b), have their config function
   called in torchtitan, which checks the stages' names against the model built on the meta
   device: the first two must pass, the last be refused.

CPU shims, only here (installed in every torchtitan process by a `sitecustomize.py` on
PYTHONPATH, so the launch command itself stays as printed):
- torchtitan takes "cuda" when torch finds no accelerator: the device type is "cpu";
- torch.cpu lacks the memory and device queries torchtitan's metrics make: stubs;
- FlexAttention refuses a backward on CPU and compiles for GPUs: it runs eagerly (its
  reference implementation), with that refusal lifted;
- FSDP2 reduces gradients with PREMUL_SUM, which gloo lacks: a sum, then the same division;
- the c4_test data set is not in the wheel: a generated text file in its place.
Beside them, not a shim, each rank prints its node and mesh coordinate
(`titan_layouts.install_mesh_report`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
BASE = "llama3:llama3_debugmodel"
# torchtitan 0.3.0's llama3_debugmodel, as a Hugging Face style config for the cost model.
DEBUG_MODEL = {
    "model_type": "llama",
    "hidden_size": 256,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "num_hidden_layers": 6,
    "intermediate_size": 768,  # compute_ffn_hidden_dim(256, multiple_of=256)
    "vocab_size": 2048,
    "tie_word_embeddings": False,
}
DEVICES, MICROBATCHES, SEQ_LEN = 2, 4, 128
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_BUILT = re.compile(r"PP rank (\d+) is building stage_idx (\d+)")
_LOSS = re.compile(r"step:\s*(\d+)\s+loss:\s*(-?[\d.]+)")


# --- inside torchtitan's processes (torch 2.14, torchtitan 0.3; no OctoPipe) ---


def install_cpu_shims() -> None:
    """What torchtitan 0.3.0 needs to train on CPU; see the module docstring."""
    import types

    import torch
    import torch._utils
    import torch.nn.attention.flex_attention as flex

    torch._utils._get_available_device_type = lambda: "cpu"
    cpu = torch.cpu
    cpu.get_device_name = lambda device=None: "cpu"
    cpu.get_device_properties = lambda device=None: types.SimpleNamespace(
        total_memory=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), name="cpu"
    )
    cpu.reset_peak_memory_stats = lambda device=None: None
    cpu.empty_cache = lambda: None
    cpu.memory_stats = lambda device=None: {}
    cpu.current_device = lambda: 0  # torch.cpu's is "cpu"; barrier(device_ids=) wants an int
    flex._validate_device = lambda query, key, value: None
    from torchtitan.models.common.attention import FlexAttention

    FlexAttention._compiled_flex_attn = flex.flex_attention
    _sum_gradients_for_gloo()


def _sum_gradients_for_gloo() -> None:
    """FSDP2 reduces gradients with PREMUL_SUM(1 / factor), which gloo lacks; torchtitan sets
    the factor to 1 (it scales by the token count itself). Summing and then dividing by the
    factor (FSDP2's own path for reductions that must be sums) gives the same gradients."""
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as collectives

    divide_factors = collectives._get_gradient_divide_factors

    def summed(rs_group, ar_group, reduce_dtype, device_type="", factor=None, force_sum=False):
        return divide_factors(rs_group, ar_group, reduce_dtype, device_type, factor, True)

    collectives._get_gradient_divide_factors = summed


# --- the check (OctoPipe's venv) ---


@dataclass
class Run:
    name: str
    placement: tuple[int, ...]
    style: str
    built: dict[int, int]  # stage -> rank, as torchtitan logged it
    losses: list[float]
    seconds: float
    error: str | None

    @property
    def matches(self) -> bool:
        return self.error is None and self.built == dict(enumerate(self.placement))


def debug_profile(folder: Path):
    from octopipe.api import profile_from_config

    config = folder / "llama3_debugmodel.json"
    config.write_text(json.dumps(DEBUG_MODEL))
    return profile_from_config(str(config), devices=DEVICES, seq_len=SEQ_LEN)


def export_baseline(profile, schedule: str, folder: Path) -> tuple[object, str]:
    """A baseline plan exported as `octopipe plan` exports a plan; its launch command."""
    from octopipe.api import baseline
    from octopipe.engines import Answer, Exports, get_engine
    from octopipe.engines.files import write_answer
    from octopipe.engines.torchtitan import torchtitan_launch_command

    plan = baseline(profile, schedule, "uniform", MICROBATCHES, DEVICES)
    answer = Answer(plan, profile, profile.name, exports=Exports(torchtitan_config=BASE))
    write_answer(get_engine("torchtitan"), answer, folder, pictures=False)
    return plan, torchtitan_launch_command(folder, DEVICES)


def export_tuned(profile, folder: Path) -> tuple[object, str]:
    """`octopipe plan` as a user runs it, on devices of unequal speed; the command it prints."""
    from octopipe.plan import load_plan
    from octopipe.profile import Device, save_profile

    path = folder.with_suffix(".profile.json")
    save_profile(profile.with_devices([Device(speed=1.0), Device(speed=0.7)]), path)
    argv = ["plan", "--profile", str(path), "--microbatches", str(MICROBATCHES), "--no-png"]
    argv += ["--quiet", "--time-budget", "60", "--torchtitan-config", BASE, "-o", str(folder)]
    done = subprocess.run(
        [sys.executable, "-m", "octopipe", *argv], capture_output=True, text=True, check=True
    )
    lines = done.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("torchtitan 0.3"))
    command = lines[at + 1].strip()  # the line after the heading
    return load_plan(folder / "plan.json", profile.num_layers), command


def prepare_run_folder(work: Path, tokenizer: Path) -> tuple[Path, dict[str, str]]:
    """A folder torchtitan starts in (none of the plans' folders), the shims, the data; the
    variables the printed command reads the tokenizer and data paths from."""
    start = work / "elsewhere"
    start.mkdir()
    shims = work / "shims"
    shims.mkdir()
    (shims / "sitecustomize.py").write_text(
        f"import sys\nsys.path.insert(0, {str(HERE)!r})\n"
        "import titan_check, titan_layouts\ntitan_check.install_cpu_shims()\n"
        "titan_layouts.install_mesh_report()\n"
    )
    data = work / "c4_test"
    data.mkdir()
    rng = random.Random(0)
    words = "the of and to in is was for on that with as by at from it an were are this".split()
    with open(data / "data.json", "w") as fh:
        for _ in range(200):
            fh.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(400))}) + "\n")
    return start, {"TORCHTITAN_ASSETS": str(tokenizer), "TORCHTITAN_DATA": str(data)}


def run_launch(command: str, extra: list[str], start: Path, titan_venv: Path, work: Path, paths):
    """The launch command as printed, plus `extra` flags, in torchtitan's venv on CPU, with
    `paths` (the tokenizer and data variables) set. A command for N nodes (`--nnodes N`) runs
    N times at once on this machine, as on N nodes whose first is 127.0.0.1."""
    env = {
        **os.environ,
        **paths,
        "PATH": f"{titan_venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(work / "shims"),  # the command keeps what PYTHONPATH held
        "GLOO_SOCKET_IFNAME": "lo",  # gloo on loopback only
        "MASTER_ADDR": "127.0.0.1",  # read by a command for several nodes only
    }
    env.pop("VIRTUAL_ENV", None)
    nodes = re.search(r"--nnodes (\d+)", command)
    line = " ".join([command, *map(shlex.quote, extra)])
    started = time.perf_counter()
    procs = [
        subprocess.Popen(
            ["bash", "-c", line], cwd=start, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )
        for _ in range(int(nodes.group(1)) if nodes else 1)
    ]  # fmt: skip
    outputs = [p.communicate(timeout=900)[0] for p in procs]
    code = next((p.returncode for p in procs if p.returncode), 0)
    return subprocess.CompletedProcess(line, code, "".join(outputs), ""), (
        time.perf_counter() - started
    )


def parse_log(text: str) -> tuple[dict[int, int], list[float]]:
    text = _ANSI.sub("", text)
    built = {int(s): int(r) for r, s in _BUILT.findall(text)}
    # Only the last stage's ranks have a loss; the others log minus the DP x CP degree.
    losses = {int(step): float(x) for step, x in _LOSS.findall(text) if float(x) >= 0}
    return built, [losses[k] for k in sorted(losses)]


def launch_steps(command: str, tag: str, start: Path, paths, titan_venv: Path, work: Path, steps):
    """Run the printed command for `steps` steps (the seed and timeouts appended); its log
    (kept as log-TAG.txt), its exit status and its wall time."""
    extra = ["--training.steps", str(steps), "--dump_folder", str(work / f"dump-{tag}")]
    extra += ["--comm.init_timeout_seconds", "300", "--comm.train_timeout_seconds", "300"]
    extra += ["--debug.seed", "0"]  # the same figures run after run
    done, seconds = run_launch(command, extra, start, titan_venv, work, paths)
    text = _ANSI.sub("", done.stdout + done.stderr)
    (work / f"log-{tag}.txt").write_text(text)
    return text, done.returncode, seconds


def train(name, plan, command, start, paths, titan_venv, work, steps) -> Run:
    from octopipe.engines.torchtitan.plan import placement_style

    style = placement_style(plan)
    text, code, seconds = launch_steps(command, style, start, paths, titan_venv, work, steps)
    built, losses = parse_log(text)
    return Run(
        name, plan.placement, style, built, losses, seconds, run_error(text, code, losses, steps)
    )


def run_error(text: str, code: int, losses: list[float], steps: int) -> str | None:
    """None for a run that trained every step; else its first rank's error line."""
    if code != 0:
        return _first_error(text)
    if len(losses) != steps:
        return f"{len(losses)} losses logged for {steps} steps"
    return None


def _first_error(text: str) -> str:
    """The exception a rank raised (`[rankN]: SomeError: ...`), else the last error line."""
    raised = re.search(r"^(?:\[rank\d+\]: )?((?:\w+\.)*\w+(?:Error|Exception): \S.*)$", text, re.M)
    if raised:
        return raised.group(1).strip()[:300]
    lines = [l for l in text.splitlines() if "Error" in l or "error" in l]
    return lines[-1].strip()[:300] if lines else "failed with no error line"


def config_check(folder: Path, titan_venv: Path, start: Path) -> str:
    """Call the exported config function in torchtitan's Python: 'ok', or its error line."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import octopipe_torchtitan as m\n"
        "try:\n    m.octopipe_plan()\nexcept Exception as exc:\n"
        "    print(f'{type(exc).__name__}: {exc}'); sys.exit(1)\nprint('ok')\n"
    )
    python = titan_venv / "bin" / "python"
    done = subprocess.run(
        [str(python), "-c", code, str(folder)], cwd=start, capture_output=True, text=True
    )
    out = done.stdout.strip().splitlines()
    return out[-1] if out else _first_error(done.stderr)


def shipped_export(name: str, folder: Path) -> Path:
    from octopipe.api import baseline, profile_from_config
    from octopipe.engines import Answer, get_engine
    from octopipe.engines.files import write_answer

    profile = profile_from_config(name, devices=4)
    plan = baseline(profile, "1f1b", "uniform", 8, 4)
    # No torchtitan config given: torchtitan's own for the shipped model.
    write_answer(get_engine("torchtitan"), Answer(plan, profile, name), folder, pictures=False)
    return folder


def wrong_base_export(profile, folder: Path) -> Path:
    from octopipe.api import baseline
    from octopipe.engines import Answer, Exports, get_engine
    from octopipe.engines.files import write_answer

    plan = baseline(profile, "1f1b", "uniform", MICROBATCHES, DEVICES)
    exports = Exports(torchtitan_config="llama3:llama3_8b")
    answer = Answer(plan, profile, profile.name, exports=exports)
    write_answer(get_engine("torchtitan"), answer, folder, pictures=False)
    return folder


def versions(titan_venv: Path) -> str:
    code = (
        "import torch, importlib.metadata as m; print(torch.__version__, m.version('torchtitan'))"
    )
    done = subprocess.run(
        [str(titan_venv / "bin" / "python"), "-c", code], capture_output=True, text=True
    )
    torch_v, titan_v = done.stdout.split()
    return f"torch {torch_v}, torchtitan {titan_v}"


def table(runs: list[Run]) -> str:
    rows = [
        "| plan | placement | stage -> rank, planned | stage -> rank, torchtitan built | "
        "same | loss per step | wall s |",
        "|---|---|---|---|---|---|---:|",
    ]
    for r in runs:
        built = " ".join(f"{s}:{r.built[s]}" for s in sorted(r.built)) or "-"
        planned = " ".join(f"{s}:{d}" for s, d in enumerate(r.placement))
        losses = ", ".join(f"{x:.4f}" for x in r.losses) if r.error is None else r.error
        rows.append(
            f"| {r.name} | {r.style} | {planned} | {built} | {'yes' if r.matches else 'NO'} | "
            f"{losses} | {r.seconds:.0f} |"
        )
    return "\n".join(rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--titan-venv", type=Path, required=True, help="venv with torchtitan 0.3")
    p.add_argument("--tokenizer", type=Path, required=True, help="torchtitan's test tokenizer")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--keep", action="store_true", help="keep the work folder (printed)")
    args = p.parse_args()
    import titan_layouts  # beside this file; it imports this module

    work = Path(tempfile.mkdtemp(prefix="titan-check-"))
    try:
        print(f"{versions(args.titan_venv.resolve())}, CPU, gloo; {DEVICES} ranks\n")
        profile = debug_profile(work)
        start, paths = prepare_run_folder(work, args.tokenizer.resolve())
        plans = [
            ("i1f1b (loop)", *export_baseline(profile, "i1f1b", work / "loop")),
            ("zbv (V)", *export_baseline(profile, "zbv", work / "v")),
            ("tuned, speeds 1.0/0.7", *export_tuned(profile, work / "free")),
        ]
        venv = args.titan_venv.resolve()
        runs = [train(n, plan, cmd, start, paths, venv, work, args.steps) for n, plan, cmd in plans]
        print(table(runs))
        print("\nCluster layouts (nodes x processes as the printed command launches them):\n")
        layout_runs, layouts_good = titan_layouts.check_layouts(
            work, start, paths, venv, args.steps
        )
        print(titan_layouts.layout_table(layout_runs))
        print("\nExported configs called in torchtitan (stage names checked against the model):")
        checks = [
            ("llama3-8b -> llama3_8b", shipped_export("llama3-8b", work / "l8b")),
            ("llama3-70b -> llama3_70b", shipped_export("llama3-70b", work / "l70b")),
            ("debug model -> llama3_8b (wrong base)", wrong_base_export(profile, work / "bad")),
        ]
        results = [(name, config_check(folder, venv, start)) for name, folder in checks]
        for name, result in results:
            print(f"- {name}: {result}")
        refused = results[-1][1] != "ok"
        good = all(r.matches for r in runs) and all(r == "ok" for _, r in results[:-1])
        good = good and layouts_good
        return 0 if good and refused else 1
    finally:
        if args.keep:
            print(f"\nwork folder: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
