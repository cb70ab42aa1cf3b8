"""The torchtitan 0.3.x export: a config module torchtitan's `--module` / `--config` take, and
the command that launches it.

`write_torchtitan_config` writes `octopipe_torchtitan.py` (the shipped `torchtitan_module.py`
with the plan's settings filled in) and, for a placement torchtitan's loop and V cannot express,
`octopipe_torchtitan_stages.py` (the shipped `torchtitan_stages.py`, unchanged) beside the plan.
Every value goes into the Python file as a literal written by `repr`, never pasted as text.
`torchtitan_launch_command` is the shell command that runs it; `octopipe plan` prints it.

The config starts from a torchtitan config function (`TorchtitanBase`, e.g.
`llama3:llama3_8b`), which holds everything a plan does not decide (model, optimizer, data).
"""

from __future__ import annotations

import keyword
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from octopipe.engines.torchtitan.layout import titan_layout
from octopipe.engines.torchtitan.names import torchtitan_names
from octopipe.engines.torchtitan.plan import caveats, comment_lines, placement_style, schedule_name
from octopipe.errors import InputError
from octopipe.outfiles import write_text
from octopipe.plan import Plan
from octopipe.profile import Profile

CONFIG_MODULE = "octopipe_torchtitan"  # the file's name is this + ".py": torchtitan's --module
CONFIG_FUNCTION = "octopipe_plan"  # torchtitan's --config
STAGES_MODULE = "octopipe_torchtitan_stages"
_SHIPPED = Path(__file__).parent
_SETTINGS = re.compile(
    r"(?ms)^# --- the plan's settings \(written by `octopipe plan`\) ---\n.*?"
    r"^# --- end of the plan's settings ---\n"
)
_CONFIG_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")  # ASCII: a public function's name
# torchtitan 0.3.0's `torchtitan.models._supported_models`: the names its --module takes short.
TORCHTITAN_MODELS = frozenset(
    ("deepseek_v3", "flux", "gpt_oss", "kimi_k2_7", "llama3", "muse_glimmer", "qwen3", "qwen3_5")
)


_REGISTRY = "torchtitan.models.{}.config_registry"


@dataclass(frozen=True)
class TorchtitanBase:
    """The torchtitan config function a plan's config starts from: `module.config()`."""

    module: str  # torchtitan.models.NAME.config_registry, NAME one of TORCHTITAN_MODELS
    config: str  # function name, e.g. llama3_8b

    @classmethod
    def parse(cls, text: str, where: str = "--torchtitan-config") -> TorchtitanBase:
        """`MODEL:CONFIG`: the config function CONFIG of a torchtitan model registry, MODEL one
        of torchtitan 0.3's model names (`llama3`, as its `--module` takes it) or its registry
        module written out (`torchtitan.models.llama3.config_registry`). Checked as text,
        nothing imported: the written module calls this function in every rank, so nothing
        else (`os:system`, a module of one's own) is accepted."""
        module, sep, config = text.partition(":")
        if not (sep and module and config):
            raise InputError(where, f"expected MODULE:CONFIG, e.g. llama3:llama3_8b, got {text!r}")
        name = module
        match = re.fullmatch(r"torchtitan\.models\.(\w+)\.config_registry", module)
        if match:
            name = match.group(1)
        if name not in TORCHTITAN_MODELS:
            raise InputError(
                where,
                f"{module!r} is not a torchtitan 0.3 model registry; expected one of "
                f"{', '.join(sorted(TORCHTITAN_MODELS))} (e.g. llama3:llama3_8b), got {text!r}",
            )
        if not _CONFIG_NAME.fullmatch(config) or keyword.iskeyword(config):
            raise InputError(
                where,
                f"expected a config function's name after ':' (letters, digits, _; not starting "
                f"with _), e.g. llama3:llama3_8b, got {text!r}",
            )
        return cls(_REGISTRY.format(name), config)


# torchtitan 0.3.0's config of each shipped model's shape, where one exists (`registry.py`
# finds them by shape, for any config.json; tests/test_torchtitan_registry.py holds the two
# together). Written out so that a shipped name needs no config read.
SHIPPED_BASES = {
    "llama3-8b": TorchtitanBase(_REGISTRY.format("llama3"), "llama3_8b"),
    "llama3-70b": TorchtitanBase(_REGISTRY.format("llama3"), "llama3_70b"),
    "llama3-405b": TorchtitanBase(_REGISTRY.format("llama3"), "llama3_405b"),
    "deepseek-v2-lite": TorchtitanBase(_REGISTRY.format("deepseek_v3"), "deepseek_v3_16b"),
    "deepseek-v3": TorchtitanBase(_REGISTRY.format("deepseek_v3"), "deepseek_v3_671b"),
}


# What the printed command passes torchtitan for its tokenizer and data, where the plan was
# not told them: shell variables that stop the command, with a message, until they are set.
ASSETS_VARIABLE = "TORCHTITAN_ASSETS"
DATA_VARIABLE = "TORCHTITAN_DATA"


def torchtitan_launch_command(
    folder: str | Path,
    num_processes: int,
    processes_per_node: int | None = None,
    assets: str | Path | None = None,
    data: str | Path | None = None,
) -> str:
    """The shell command that trains the plan whose export lies in `folder` under torchtitan
    0.3.x: one process per GPU, `num_processes` = TP x CP x PP x DP of them. On one node (the
    default) torchrun's `--standalone`; over several, the same command on every node, with
    `$MASTER_ADDR` the first node's address. It ends with torchtitan's flags for the tokenizer
    folder (`--hf_assets_path`) and the data (`--dataloader.dataset_path`): `assets` and `data`
    (absolute), or the variables $TORCHTITAN_ASSETS and $TORCHTITAN_DATA, which the shell
    insists on, so that the command runs from anywhere, not only a torchtitan checkout."""
    folder = Path(folder).resolve()
    launch = f"PYTHONPATH={shlex.quote(str(folder))}${{PYTHONPATH:+:$PYTHONPATH}} torchrun"
    if processes_per_node is None or num_processes <= processes_per_node:
        launch += f" --standalone --nproc-per-node {num_processes}"
    else:
        if num_processes % processes_per_node:
            raise ValueError(f"{num_processes} processes do not fill nodes of {processes_per_node}")
        nodes = num_processes // processes_per_node
        launch += (
            f" --nnodes {nodes} --nproc-per-node {processes_per_node}"
            ' --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:29500"'
        )
    launch += f" -m torchtitan.train --module {CONFIG_MODULE} --config {CONFIG_FUNCTION}"
    launch += " --hf_assets_path " + _path_word(assets, ASSETS_VARIABLE, "the tokenizer folder")
    launch += " --dataloader.dataset_path " + _path_word(data, DATA_VARIABLE, "the data set")
    return launch


def _path_word(path: str | Path | None, variable: str, what: str) -> str:
    if path is not None:
        return shlex.quote(str(Path(path).resolve()))
    return f'"${{{variable}:?set {variable} to {what}}}"'


def torchtitan_config_settings(
    plan: Plan, profile: Profile, base: TorchtitanBase, csv_path: Path, where: str
) -> dict[str, Any]:
    """The values of the written module's settings block, by constant name. The stages'
    names are torchtitan 0.3's (`titan_names`); a profile whose names have none, or a plan
    torchtitan 0.3 cannot run (`titan_layout`), is an InputError."""
    if not csv_path.is_absolute():
        raise ValueError(f"the schedule CSV path must be absolute, got {csv_path}")
    names = torchtitan_names(profile, where)
    lay = titan_layout(plan, profile)
    training: dict[str, Any] = {
        "local_batch_size": lay.local_batch_size,
        "global_batch_size": lay.global_batch_size,  # accumulated without PP
    }
    if profile.seq_len is not None:
        training["seq_len"] = profile.seq_len
    # torchtitan 0.3 refuses CUDA graphs with pipeline parallelism unless told to skip them.
    training["disable_cuda_graphs"] = True
    return {
        "PROFILE": profile.name,
        "BASE_MODULE": base.module,
        "BASE_CONFIG": base.config,
        "SCHEDULE_CSV": str(csv_path),
        "PLACEMENT": placement_style(plan),
        "PARALLELISM": {
            **lay.parallelism(),
            "pipeline_parallel_schedule": schedule_name(plan),
            "pipeline_parallel_schedule_csv": str(csv_path),
            "pipeline_parallel_microbatch_size": lay.microbatch_size,
            "module_fqns_per_model_part": [names[s.start : s.end] for s in plan.stages],
            "pipeline_parallel_layers_per_stage": None,  # the stages are given by name
        },
        "TRAINING": training,
        "ACTIVATION_CHECKPOINTING": lay.activation_checkpoint,
        "PRECISION": profile.precision,
    }


def write_torchtitan_config(
    plan: Plan,
    profile: Profile,
    folder: str | Path,
    base: TorchtitanBase,
    where: str,
    processes_per_node: int | None = None,
    assets: str | Path | None = None,
    data: str | Path | None = None,
) -> list[str]:
    """Write the torchtitan 0.3.x config for `plan` into `folder` (which holds the plan's
    `schedule.csv`); returns the names of the files written. Nothing is written for a plan
    torchtitan 0.3 cannot run (an InputError)."""
    folder = Path(folder).resolve()
    if ":" in str(folder):
        raise InputError(str(folder), "a folder whose path holds ':' cannot be on PYTHONPATH")
    settings = torchtitan_config_settings(plan, profile, base, folder / "schedule.csv", where)
    lay = titan_layout(plan, profile, processes_per_node)
    launch = torchtitan_launch_command(folder, lay.world, processes_per_node, assets, data)
    notes = [*lay.notes, *caveats(plan, profile, layout_notes=False)]
    if profile.seq_len is None:
        notes.append(
            "The profile does not record its sequence length, so the base config's "
            "training.seq_len is kept; give --training.seq_len to match the plan's costs."
        )
    block = _settings_block({"LAUNCH": launch, **settings}, notes)
    template = (_SHIPPED / "torchtitan_module.py").read_text(encoding="utf-8")
    text, count = _SETTINGS.subn(lambda _: block, template)
    assert count == 1, "torchtitan_module.py lost its settings markers"
    write_text(folder / f"{CONFIG_MODULE}.py", text)
    written = [f"{CONFIG_MODULE}.py"]
    if settings["PLACEMENT"] == "free":
        stages = (_SHIPPED / "torchtitan_stages.py").read_text(encoding="utf-8")
        write_text(folder / f"{STAGES_MODULE}.py", stages)
        written.append(f"{STAGES_MODULE}.py")
    return written


def _settings_block(constants: dict[str, Any], notes: list[str]) -> str:
    lines = ["# --- the plan's settings (written by `octopipe plan`) ---\n"]
    if notes:
        lines.append(comment_lines(notes))
    lines += [f"{name} = {python_literal(value)}\n" for name, value in constants.items()]
    lines.append("# --- end of the plan's settings ---\n")
    return "".join(lines)


def python_literal(value: Any, indent: int = 0) -> str:
    """`value` (str, int, bool, None, and lists and dicts of them) as Python source that
    evaluates to it: every scalar by `repr`, whatever its characters; a dict one key per line,
    a list of lists one inner list per line."""
    pad = " " * (indent + 4)
    if isinstance(value, dict):
        items = "".join(f"{pad}{k!r}: {python_literal(v, indent + 4)},\n" for k, v in value.items())
        return "{\n" + items + " " * indent + "}"
    if isinstance(value, list) and any(isinstance(v, (list, dict)) for v in value):
        items = "".join(f"{pad}{python_literal(v, indent + 4)},\n" for v in value)
        return "[\n" + items + " " * indent + "]"
    if isinstance(value, (list, str, int, bool)) or value is None:
        return repr(value)
    raise TypeError(f"no Python literal for {type(value).__name__}")
