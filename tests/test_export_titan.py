"""The torchtitan 0.3 export: the written config module holds the plan's values for loop, V and
free placements and imports without torch or OctoPipe; its checks refuse a model it does not
fit; the stage override places stages as the CSV (and torch's own CSV reader) says; names that
torchtitan lacks are refused at export in one line; paths are absolute and safely quoted.

torchtitan itself is not installed here (it needs torch 2.14): `benchmarks/titan_check.py`
trains these files in torchtitan 0.3.0.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

from octopipe.actions import Action
from octopipe.api import baseline, profile_from_config
from octopipe.cli import main
from octopipe.engines import Answer, Exports, get_engine
from octopipe.engines.torchtitan import (
    TorchtitanBase,
    torchtitan_launch_command,
    torchtitan_names,
    write_torchtitan_config,
)
from octopipe.engines.torchtitan.config import python_literal
from octopipe.engines.torchtitan.layout import titan_layout
from octopipe.engines.torchtitan.toml import to_toml, torchtitan_settings
from octopipe.errors import InputError
from octopipe.plan import make_plan, save_schedule_csv
from octopipe.profile import Device, LayerCost, Profile, save_profile
from octopipe.sim import Simulator

BASE = TorchtitanBase.parse("llama3:llama3_debugmodel")
NAMES = ["tok_embeddings", *(f"layers.{i}" for i in range(6)), "norm", "output"]
TITAN = ["tok_embeddings", *(f"layers.{i}" for i in range(6)), "norm", "lm_head"]


def profile(names=NAMES, **keys) -> Profile:
    layers = tuple(
        LayerCost(
            name=n, f=1.0, b=1.0, w=0.5, act_bytes=10, wact_bytes=5, param_bytes=100, out_bytes=1
        )
        for n in names
    )
    return Profile(**{"name": "debug", "layers": layers, "devices": (Device(),) * 2, **keys})


def free_plan():
    """Three stages on two devices, the first and last on device 0: neither loop nor V."""
    d0 = "0F0 0F1 2F0 2B0 2F1 2B1 0B0 0B1".split()
    d1 = "1F0 1F1 1B0 1B1".split()
    orders = {0: [Action.parse(a) for a in d0], 1: [Action.parse(a) for a in d1]}
    return make_plan(2, 2, [(0, 3), (3, 6), (6, 9)], (0, 1, 0), orders)


def plans(prof):
    return {
        "loop": baseline(prof, "i1f1b", "uniform", num_microbatches=4, num_devices=2),
        "v": baseline(prof, "zbv", "uniform", num_microbatches=4, num_devices=2),
        "free": free_plan(),
    }


def export(plan, prof, folder: Path) -> ModuleType:
    """Write the plan's CSV and torchtitan 0.3 config into `folder`; import the module."""
    folder.mkdir(parents=True, exist_ok=True)
    save_schedule_csv(plan, folder / "schedule.csv")
    write_torchtitan_config(plan, prof, folder, BASE, "debug.json")
    return load_module(folder / "octopipe_torchtitan.py")


def load_module(path: Path) -> ModuleType:
    name = f"written_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_free_plan_is_valid():
    Simulator(profile()).run(free_plan())  # a deadlock or a missing action would raise


@pytest.mark.parametrize("style", ["loop", "v", "free"])
def test_config_module_holds_the_plans_values(style, tmp_path):
    prof = profile(microbatch_size=2, seq_len=128)
    plan = plans(prof)[style]
    folder = tmp_path / "out"
    written = export(plan, prof, folder)
    assert written.PLACEMENT == style
    assert (written.BASE_MODULE, written.BASE_CONFIG) == (BASE.module, BASE.config)
    csv = str((folder / "schedule.csv").resolve())
    assert written.SCHEDULE_CSV == csv
    par = written.PARALLELISM
    assert par["pipeline_parallel_degree"] == 2
    assert (
        par["pipeline_parallel_schedule"]
        == {
            "loop": "PipelineScheduleMulti",
            "v": "ZBVZeroBubble",  # the name that makes torchtitan build its V
            "free": "PipelineScheduleMulti",
        }[style]
    )
    assert par["pipeline_parallel_schedule_csv"] == csv
    assert par["pipeline_parallel_microbatch_size"] == 2
    stages = par["module_fqns_per_model_part"]
    assert stages == [TITAN[s.start : s.end] for s in plan.stages]
    assert [n for stage in stages for n in stage] == TITAN  # the head is torchtitan's lm_head
    assert (par["tensor_parallel_degree"], par["data_parallel_replicate_degree"]) == (1, 1)
    assert par["data_parallel_shard_degree"] == 1
    assert par["pipeline_parallel_layers_per_stage"] is None
    assert (par["context_parallel_degree"], par["expert_parallel_degree"]) == (1, 1)
    # torchtitan's microbatches: local_batch_size / pipeline_parallel_microbatch_size.
    assert written.TRAINING == {
        "local_batch_size": plan.num_microbatches * 2,
        "global_batch_size": plan.num_microbatches * 2,
        "seq_len": 128,
        "disable_cuda_graphs": True,
    }
    # As planned: these plans recompute nothing (the base config's selective AC is replaced).
    assert written.ACTIVATION_CHECKPOINTING == "none"
    assert written.LAUNCH == torchtitan_launch_command(folder, 2)
    assert (folder / "octopipe_torchtitan_stages.py").exists() == (style == "free")


def test_degrees_come_from_the_plans_parallelism(tmp_path):
    prof = profile(microbatch_size=3)
    plan = plans(prof)["loop"].with_shape(tp=4, dp=2, microbatch_size=1)
    written = export(plan, prof, tmp_path / "out")
    par = written.PARALLELISM
    assert (par["tensor_parallel_degree"], par["data_parallel_replicate_degree"]) == (4, 2)
    assert par["pipeline_parallel_microbatch_size"] == 1
    assert written.TRAINING["global_batch_size"] == 2 * written.TRAINING["local_batch_size"]
    assert "--nproc-per-node 16" in written.LAUNCH  # TP x PP x DP processes


def test_without_pp_the_microbatches_are_accumulated(tmp_path):
    """One device, M microbatches of b: torchtitan runs passes of one microbatch and
    accumulates M of them (global = M x b x DP = local x DP x M)."""
    prof = profile(microbatch_size=2, devices=(Device(),))
    plan = baseline(prof, "1f1b", "uniform", num_microbatches=4, num_devices=1)
    plan = plan.with_shape(tp=1, dp=2, microbatch_size=2, zero=3)
    written = export(plan, prof, tmp_path / "out")
    training = written.TRAINING
    assert (training["local_batch_size"], training["global_batch_size"]) == (2, 4 * 2 * 2)
    lay = titan_layout(plan, prof)
    assert lay.accumulation == 4 and lay.global_batch_size == 16


def test_the_whole_layout_reaches_torchtitan(tmp_path):
    """The 64-GPU Llama-3-70B answer's shape: TP 2 x CP 4 x PP 2 (here) x DP 2, EP, ZeRO-3 over
    HSDP groups: every degree is written and the launch takes every GPU."""
    prof = profile(microbatch_size=1, seq_len=4096)
    plan = plans(prof)["loop"].with_shape(
        tp=2, dp=2, microbatch_size=1, cp=4, ep=8, zero=3, shard_group=4
    )
    written = export(plan, prof, tmp_path / "out")
    par = written.PARALLELISM
    got = {k: par[k] for k in par if k.endswith("_degree")}
    assert got == {
        "pipeline_parallel_degree": 2,
        "tensor_parallel_degree": 2,
        "context_parallel_degree": 4,
        "data_parallel_replicate_degree": 2,  # 8 DP x CP ranks, shards of 4 = CP 4 x dp_shard 1
        "data_parallel_shard_degree": 1,
        "expert_parallel_degree": 8,
    }
    assert "--nproc-per-node 32" in written.LAUNCH  # 2 x 4 x 2 x 2
    multi = torchtitan_launch_command(tmp_path / "out", 32, processes_per_node=8)
    assert "--nnodes 4 --nproc-per-node 8" in multi


@pytest.mark.parametrize(
    "zero, cp, degrees, note",
    [
        (0, 1, (2, 1), None),  # DDP: the plan's whole replicas
        (1, 1, (1, 2), "torchtitan has no ZeRO-1: the plan's optimizer-state sharding"),
        (3, 1, (1, 2), None),  # FSDP over every DP rank
        (0, 2, (2, 1), "torchtitan shards weights, gradients and optimizer state over the CP"),
        (1, 2, (1, 2), "torchtitan has no ZeRO-1"),
    ],
)
def test_data_parallelism_is_what_torchtitan_runs(zero, cp, degrees, note, tmp_path):
    prof = profile(microbatch_size=1, seq_len=4096)
    plan = plans(prof)["loop"].with_shape(tp=1, dp=2, microbatch_size=1, zero=zero, cp=cp)
    lay = titan_layout(plan, prof)
    assert (lay.dp_replicate, lay.dp_shard) == degrees
    assert lay.world == 2 * cp * 2
    if note is None:
        assert lay.notes == ()
    else:
        assert len(lay.notes) == 1 and lay.notes[0].startswith(note)
        assert "--runner torchtitan" in lay.notes[0]
        text = export(plan, prof, tmp_path / "out").__file__
        assert note.split(":")[0] in Path(text).read_text()


def test_what_torchtitan_cannot_run_is_refused_in_one_line(tmp_path, capsys):
    prof = profile(microbatch_size=1, seq_len=4096)
    loop = plans(prof)["loop"]
    cases = [
        # EP over dp_shard x CP x TP = 1 x 1 x 2 under DDP: 4 does not divide 2.
        (loop.with_shape(tp=2, dp=2, microbatch_size=1, ep=4), "parallelism.ep: torch"),
        # HSDP shards of 3 across CP 2.
        (
            loop.with_shape(tp=1, dp=3, microbatch_size=1, cp=2, zero=3, shard_group=3),
            "parallelism.shard_group: torchtitan 0.3 shards over dp_shard x CP",
        ),
        # Recomputation under a split backward.
        (
            plans(prof)["v"].with_shape(tp=1, dp=1, microbatch_size=1, recompute="full"),
            "the plan recomputes (full) under a split backward",
        ),
    ]
    for plan, message in cases:
        with pytest.raises(InputError, match=re.escape(message)) as caught:
            titan_layout(plan, prof)
        assert "\n" not in str(caught.value)
        folder = tmp_path / str(len(message))
        folder.mkdir()
        save_schedule_csv(plan, folder / "schedule.csv")
        with pytest.raises(InputError):
            write_torchtitan_config(plan, prof, folder, BASE, "p.json")
        assert not (folder / "octopipe_torchtitan.py").exists()
        exports = Exports(torchtitan_config="llama3:llama3_debugmodel")
        lines = get_engine("torchtitan").launch(
            Answer(plan, prof, "p.json", exports=exports), folder
        )
        assert len(lines) == 1  # one line says why there is no config
        assert lines[0].startswith("torchtitan 0.3: no octopipe_torchtitan.py: plan.json: ")


@pytest.mark.parametrize(
    "layout, stages, expected",
    [
        ("none", ("none", "none"), "none"),
        ("selective", ("none", "none"), "selective"),
        ("full", ("none", "none"), "full"),
        ("none", ("selective", "none"), "selective"),  # one setting: the heaviest
        ("none", ("full", "selective"), "full"),
    ],
)
def test_activation_checkpointing_as_planned(layout, stages, expected, tmp_path):
    prof = profile(microbatch_size=1, seq_len=64)
    loop = baseline(prof, "1f1b", "uniform", num_microbatches=4, num_devices=2)
    plan = loop.with_shape(tp=1, dp=1, microbatch_size=1, recompute=layout)
    plan = replace(plan, recompute=stages)
    written = export(plan, prof, tmp_path / "out")
    assert written.ACTIVATION_CHECKPOINTING == expected
    text = Path(written.__file__).read_text()
    assert ("one setting for every block" in text) == (layout == "none" and len(set(stages)) > 1)
    assert ("saves every second matmul" in text) == (expected == "selective")


def test_the_printed_command_names_the_tokenizer_and_data(tmp_path):
    command = torchtitan_launch_command(tmp_path, 2, assets=tmp_path / "tok", data="rel/data")
    words = shlex.split(command)
    assert words[-4:] == [
        "--hf_assets_path",
        str((tmp_path / "tok").resolve()),
        "--dataloader.dataset_path",
        str(Path("rel/data").resolve()),
    ]
    unset = torchtitan_launch_command(tmp_path, 2)
    done = subprocess.run(
        ["bash", "-c", unset.replace(" torchrun ", " echo ", 1)],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
    assert "TORCHTITAN_ASSETS: set TORCHTITAN_ASSETS to the tokenizer folder" in done.stderr


def test_torchtitans_rank_order_is_pointed_out_where_it_moves_unlike_devices(tmp_path):
    note = "# torchtitan numbers ranks with the pipeline outermost"
    for devices, dp, noted in [
        ((Device(), Device()), 2, False),  # alike: any order will do
        ((Device(), Device(speed=0.5)), 1, False),  # one replica: both numberings agree
        ((Device(), Device(speed=0.5)), 2, True),
    ]:
        prof = profile(devices=devices)
        plan = plans(prof)["loop"].with_shape(tp=1, dp=dp, microbatch_size=1)
        folder = tmp_path / f"{dp}-{noted}"
        export(plan, prof, folder)
        assert (note in (folder / "octopipe_torchtitan.py").read_text()) == noted


def test_without_a_sequence_length_the_base_configs_is_kept_and_said_so(tmp_path):
    prof = profile()
    export(plans(prof)["loop"], prof, tmp_path / "out")
    text = (tmp_path / "out" / "octopipe_torchtitan.py").read_text()
    written = load_module(tmp_path / "out" / "octopipe_torchtitan.py")
    assert "seq_len" not in written.TRAINING
    assert "# The profile does not record its sequence length" in text
    assert "# The profile does not record its microbatch size, so 1 was assumed" in text


def test_written_modules_import_standalone_without_torch_or_octopipe(tmp_path):
    prof = profile()
    export(plans(prof)["free"], prof, tmp_path / "out")
    code = (
        "import sys, octopipe_torchtitan, octopipe_torchtitan_stages\n"
        "print(sorted(m for m in ('torch', 'torchtitan', 'octopipe') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path / "out",
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "[]"


def trainer_config():
    """The fields of torchtitan 0.3's Trainer.Config that the export sets, at their defaults."""
    parallelism = SimpleNamespace(
        pipeline_parallel_degree=1,
        pipeline_parallel_schedule="1F1B",
        pipeline_parallel_schedule_csv="",
        pipeline_parallel_microbatch_size=1,
        module_fqns_per_model_part=None,
        tensor_parallel_degree=1,
        data_parallel_replicate_degree=1,
        data_parallel_shard_degree=-1,
        pipeline_parallel_layers_per_stage=None,
        context_parallel_degree=1,
        expert_parallel_degree=1,
    )
    training = SimpleNamespace(
        local_batch_size=8, global_batch_size=-1, seq_len=2048, disable_cuda_graphs=False
    )
    return SimpleNamespace(parallelism=parallelism, training=training, activation_checkpoint="sac")


def test_apply_plan_sets_the_settings_and_refuses_another_torchtitans_fields(tmp_path):
    prof = profile(seq_len=64)
    written = export(plans(prof)["v"], prof, tmp_path / "out")
    config = trainer_config()
    written.apply_plan(config)
    assert vars(config.parallelism) == written.PARALLELISM
    assert vars(config.training) == written.TRAINING
    assert config.activation_checkpoint is None  # the plan recomputes nothing
    del config.training.disable_cuda_graphs  # as in a torchtitan without that setting
    with pytest.raises(AttributeError, match="training has no 'disable_cuda_graphs'; this file"):
        written.apply_plan(config)


class Decoder(nn.Module):
    """torchtitan 0.3's decoder layout: tok_embeddings, layers (a ModuleDict), norm, lm_head,
    and a module without weights (as its rotary embedding)."""

    def __init__(self, num_blocks: int = 6):
        super().__init__()
        self.tok_embeddings = nn.Embedding(16, 8)
        self.rope = nn.Identity()
        self.layers = nn.ModuleDict({str(i): nn.Linear(8, 8) for i in range(num_blocks)})
        self.norm = nn.RMSNorm(8)
        self.lm_head = nn.Linear(8, 16)


def config_of(model_factory):
    return SimpleNamespace(model_spec=SimpleNamespace(model=SimpleNamespace(build=model_factory)))


def test_model_modules_reads_the_split_names_of_a_model_built_on_meta(tmp_path):
    prof = profile()
    written = export(plans(prof)["loop"], prof, tmp_path / "out")
    built = []

    def build():
        model = Decoder()
        built.append(next(model.parameters()).device)
        return model

    modules = written.model_modules(config_of(build))
    assert built == [torch.device("meta")]
    assert modules == {"rope": False, **dict.fromkeys(TITAN, True)}
    written.check_stage_modules(modules, written.PARALLELISM["module_fqns_per_model_part"])


@pytest.mark.parametrize(
    "stages, message",
    [
        ([TITAN[:8] + ["output"]], r"stage 0 names 'output', which the model of .* not have"),
        ([TITAN[:8]], r"has 'lm_head', which no stage holds \(1 such modules\)"),
        ([TITAN[:5], TITAN[4:]], r"'layers.3' is in two stages"),
    ],
)
def test_check_stage_modules_refuses_a_plan_for_another_model(stages, message, tmp_path):
    prof = profile()
    written = export(plans(prof)["loop"], prof, tmp_path / "out")
    modules = written.model_modules(config_of(Decoder))
    with pytest.raises(ValueError, match=message) as caught:
        written.check_stage_modules(modules, stages)
    assert "\n" not in str(caught.value)


def test_a_smaller_base_model_is_refused_by_name():
    import octopipe.engines.torchtitan.torchtitan_module as template

    modules = template.model_modules(config_of(lambda: Decoder(num_blocks=4)))
    with pytest.raises(ValueError, match="names 'layers.4', which the model"):
        template.check_stage_modules(modules, [TITAN])


def stages_module(tmp_path) -> ModuleType:
    prof = profile()
    export(plans(prof)["free"], prof, tmp_path / "out")
    return load_module(tmp_path / "out" / "octopipe_torchtitan_stages.py")


@pytest.mark.parametrize("style", ["loop", "v", "free"])
def test_the_override_maps_stages_to_ranks_as_the_csv_and_torchs_reader_do(style, tmp_path):
    stages = stages_module(tmp_path)
    plan = plans(profile())[style]
    csv = tmp_path / f"{style}.csv"
    save_schedule_csv(plan, csv)
    ranks = stages.stage_ranks(str(csv))
    assert ranks == dict(enumerate(plan.placement))
    runtime = _PipelineScheduleRuntime(
        [
            SimpleNamespace(
                num_stages=plan.num_stages,
                group_size=2,
                group_rank=0,
                stage_index=i,
                stage_index_to_group_rank=None,
            )
            for i in plan.stages_on(0)
        ],
        plan.num_microbatches,
    )
    runtime._load_csv(str(csv))
    assert runtime.stage_index_to_group_rank == ranks  # torch infers the same map

    pipeline_parallel = ModuleType("torchtitan.distributed.pipeline_parallel")
    pipeline_parallel._get_pp_rank_to_stage_indices_mapping = lambda *args: ("torchtitan's",)
    stages.install(str(csv), pipeline_parallel)
    mapping = pipeline_parallel._get_pp_rank_to_stage_indices_mapping
    for rank in range(2):
        built = mapping(rank, 2, "PipelineScheduleMulti", plan.num_stages)
        assert built == tuple(plan.stages_on(rank))
    with pytest.raises(ValueError, match="has 3 stages, torchtitan's module_fqns_per_model_part 5"):
        stages.stages_of_rank(stages.stage_ranks(str(tmp_path / "out" / "schedule.csv")), 0, 2, 5)
    with pytest.raises(ValueError, match="uses rank 1, beyond pipeline_parallel_degree 1"):
        mapping(0, 1, "PipelineScheduleMulti", plan.num_stages)


def test_the_override_reads_composite_entries_and_refuses_bad_csvs(tmp_path):
    stages = stages_module(tmp_path)
    path = tmp_path / "s.csv"
    path.write_text("0F0,3F0,(0F1;3B0)OVERLAP_F_B\n1F0,,2F0,(1F1;2B0)OVERLAP_F_B\n")
    assert stages.stage_ranks(str(path)) == {0: 0, 3: 0, 1: 1, 2: 1}  # a V, as DualPipeV's
    for text, message in [
        ("0F0,1F0\n1B0\n", "stage 1 has actions on rank 0 and rank 1"),
        ("0F0,0B0\n2F0,2B0\n", "no rank runs stage 1"),
        ("\n", "no actions"),
    ]:
        path.write_text(text)
        with pytest.raises(ValueError, match=message):
            stages.stage_ranks(str(path))
    with pytest.raises(RuntimeError, match="is for torchtitan 0.3.x"):
        stages.install(str(path.with_name("out") / "schedule.csv"), ModuleType("elsewhere"))


def test_profile_names_map_to_torchtitans_decoder_and_others_are_refused():
    hf = ["model.embed_tokens", *(f"model.layers.{i}" for i in range(6)), "model.norm", "lm_head"]
    assert torchtitan_names(profile(NAMES), "p.json") == TITAN
    assert torchtitan_names(profile(hf), "p.json") == TITAN
    for names, message in [
        (["vision.patch_embed", *NAMES], "layers[0].name: 'vision.patch_embed' has no module in"),
        ([*NAMES[:7], "output", "norm"], "layers[7].name: torchtitan 0.3's decoder has 'norm'"),
        ([NAMES[0], "layers.1", *NAMES[2:]], "layers[1].name: torchtitan 0.3's decoder has "),
        (NAMES[:7], "layers: the profile ends before torchtitan 0.3's decoder does: it lacks"),
        ([*NAMES, "output"], "layers[9].name: torchtitan 0.3's decoder ends at 'lm_head'"),
    ]:
        with pytest.raises(InputError, match=message.replace("[", r"\[")) as caught:
            torchtitan_names(profile(names), "p.json")
        assert str(caught.value).startswith("p.json: ")


def test_plan_refuses_a_profile_torchtitan_cannot_run_before_writing(tmp_path, capsys):
    prof = profile(["vision.patch_embed", *NAMES])
    save_profile(prof, tmp_path / "vlm.json")
    argv = ["plan", "--profile", str(tmp_path / "vlm.json"), "--microbatches", "4", "--quiet"]
    argv += ["--torchtitan-config", "llama3:llama3_8b", "-o", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "vlm.json: layers[0].name: 'vision.patch_embed' has no module in torchtitan" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text", ["llama3", "llama3:", ":x", "x:"])
def test_a_bad_torchtitan_config_is_one_line(text, tmp_path, capsys):
    argv = ["plan", "--model", "tiny-llama", "--devices", "2", "--torchtitan-config", text]
    assert main([*argv, "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "octopipe plan: error: --torchtitan-config: expected MODULE:CONFIG, e.g. "
        f"llama3:llama3_8b, got {text!r}"
    )


# The written module calls MODULE.CONFIG() in every rank: only a torchtitan model registry's
# config function is taken, checked as text (nothing is imported to check it).
@pytest.mark.parametrize(
    "text",
    [
        "os:system",
        "subprocess:run",
        "builtins:exec",
        "mine:big",  # a module of one's own
        "my_pkg.configs:big",
        "torchtitan.models.llama3:llama3_8b",  # the package, not its config registry
        "torchtitan.models.os.config_registry:x",
        "torchtitan.train:main",
        "a b:c",
    ],
)
def test_only_a_torchtitan_registry_is_accepted(text, tmp_path, capsys):
    argv = ["plan", "--model", "tiny-llama", "--devices", "2", "--torchtitan-config", text]
    assert main([*argv, "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "is not a torchtitan 0.3 model registry; expected one of deepseek_v3, flux" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "text",
    [
        "llama3:8b-x",
        "llama3:_private",
        "llama3:__import__",
        "llama3:a.b",
        "llama3:a:b",
        "llama3:class",
        "llama3:x\n",
        "llama3:llama3_8b()",
    ],
)
def test_only_a_plain_function_name_is_accepted(text, capsys):
    with pytest.raises(InputError, match="expected a config function's name after ':'"):
        TorchtitanBase.parse(text)


def test_torchtitan_config_names_a_module_as_torchtitan_does():
    registry = "torchtitan.models.qwen3.config_registry"
    assert TorchtitanBase.parse("qwen3:qwen3_0_6b") == TorchtitanBase(registry, "qwen3_0_6b")
    assert TorchtitanBase.parse(f"{registry}:qwen3_0_6b") == TorchtitanBase(registry, "qwen3_0_6b")


def test_plan_of_a_shipped_llama_exports_for_torchtitan_and_prints_the_launch(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["plan", "--model", "llama3-8b", "--devices", "4", "--seq-len", "1024", "--no-png"]
    assert main([*argv, "--time-budget", "2", "--quiet", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    written = load_module(out / "octopipe_torchtitan.py")
    assert written.BASE_CONFIG == "llama3_8b"
    assert written.TRAINING["seq_len"] == 1024
    assert f"\n  {torchtitan_launch_command(out, 4)}\n" in text  # on a line of its own
    assert "octopipe_torchtitan.py" in text


def test_plan_of_a_profile_says_how_to_get_a_torchtitan_03_config(tmp_path, capsys):
    path = tmp_path / "p.json"
    save_profile(profile(), path)
    argv = ["plan", "--profile", str(path), "--microbatches", "4", "--no-png", "--quiet"]
    assert main([*argv, "--time-budget", "1", "-o", str(tmp_path / "out")]) == 0
    assert "give --torchtitan-config MODULE:CONFIG" in capsys.readouterr().out
    assert not (tmp_path / "out" / "octopipe_torchtitan.py").exists()


def test_paths_are_absolute_from_a_relative_output_folder(tmp_path, capsys, monkeypatch):
    path = tmp_path / "p.json"
    save_profile(profile(), path)
    monkeypatch.chdir(tmp_path)
    argv = ["plan", "--profile", "p.json", "--microbatches", "4", "--no-png", "--quiet"]
    argv += ["--torchtitan-config", "llama3:llama3_debugmodel", "--time-budget", "1"]
    assert main([*argv, "-o", "rel/out"]) == 0
    written = load_module(tmp_path / "rel" / "out" / "octopipe_torchtitan.py")
    csv = str((tmp_path / "rel" / "out" / "schedule.csv").resolve())
    assert written.SCHEDULE_CSV == csv == written.PARALLELISM["pipeline_parallel_schedule_csv"]
    assert f"PYTHONPATH={(tmp_path / 'rel' / 'out').resolve()}$" in written.LAUNCH
    toml = (tmp_path / "rel" / "out" / "torchtitan.toml").read_text()
    assert f'pipeline_parallel_schedule_csv = "{csv}"' in toml


def test_launch_command_quotes_the_folder_for_the_shell(tmp_path):
    folder = tmp_path / 'it\'s a "plan" $HOME `x`'
    folder.mkdir()
    command = torchtitan_launch_command(folder, 2)
    prefix = command.split(" torchrun ")[0]
    echoed = subprocess.run(
        ["bash", "-c", f"{prefix} printenv PYTHONPATH"],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": "/elsewhere"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert echoed.stdout.rstrip("\n") == f"{folder.resolve()}:/elsewhere"  # kept, not replaced
    assert (
        " torchrun --standalone --nproc-per-node 2 -m torchtitan.train "
        "--module octopipe_torchtitan --config octopipe_plan --hf_assets_path "
    ) in command
    multi = torchtitan_launch_command(folder, 16, processes_per_node=8)
    assert '--nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR' in (
        multi
    )
    with pytest.raises(ValueError, match="12 processes do not fill nodes of 8"):
        torchtitan_launch_command(folder, 12, processes_per_node=8)


def test_a_folder_python_path_cannot_hold_is_refused(tmp_path):
    prof = profile()
    with pytest.raises(InputError, match="a folder whose path holds ':' cannot be on PYTHONPATH"):
        write_torchtitan_config(plans(prof)["loop"], prof, tmp_path / "a:b", BASE, "p.json")


# Names as a file system allows them: no '/', no NUL, no ':' (PYTHONPATH's separator).
_FOLDER = st.text(
    st.characters(blacklist_characters="/\x00:", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=12,
).filter(lambda s: s not in (".", ".."))


@settings(max_examples=60, deadline=None)
@given(folder=_FOLDER, name=st.text())
def test_any_folder_or_profile_name_is_written_as_a_python_literal(tmp_path_factory, folder, name):
    prof = profile(name=name)
    where = tmp_path_factory.mktemp("t") / folder
    written = export(plans(prof)["free"], prof, where)
    assert written.PROFILE == name
    assert written.SCHEDULE_CSV == str((where / "schedule.csv").resolve())
    assert shlex.split(written.LAUNCH)[0] == (
        f"PYTHONPATH={where.resolve()}${{PYTHONPATH:+:$PYTHONPATH}}"
    )


def _containers(children):
    return st.lists(children, max_size=3) | st.dictionaries(st.text(), children, max_size=3)


@given(value=st.recursive(st.none() | st.booleans() | st.integers() | st.text(), _containers))
def test_python_literal_evaluates_back_to_its_value(value):
    import ast

    assert ast.literal_eval(python_literal(value)) == value


def test_the_analytic_profile_records_its_sequence_length(tmp_path):
    prof = profile_from_config("tiny-llama", devices=2, seq_len=96)
    assert prof.seq_len == 96
    save_profile(prof, tmp_path / "p.json")
    from octopipe.profile import load_profile

    assert load_profile(tmp_path / "p.json").seq_len == 96
    assert (
        load_profile(tmp_path / "p.json")
        .model_copy(update={"seq_len": None})
        .to_dict()
        .get("seq_len")
        is None
    )


@pytest.mark.parametrize("precision", ["bf16", "fp8", "mxfp8"])
def test_the_precision_priced_is_the_precision_written(precision, tmp_path):
    """torchtitan 0.3's module converts the blocks' linears (not the head) as priced; 0.2's
    TOML names its converters and their recipes."""
    prof = profile(microbatch_size=2, seq_len=128).model_copy(update={"precision": precision})
    plan = plans(prof)["loop"]
    written = export(plan, prof, tmp_path / "out")
    assert written.PRECISION == precision
    toml = torchtitan_settings(plan, prof, "s.csv")
    if precision == "bf16":
        assert "model" not in toml and written.quantization("bf16") == []
    else:
        kind = {"fp8": "float8", "mxfp8": "mx"}[precision]
        assert toml["model"]["converters"] == [f"quantize.linear.{kind}"]  # dense: no experts
        assert toml[f"quantize.linear.{kind}"]["filter_fqns"] == ["output"]
        assert re.search(r"(?m)^\[model\]\nconverters = \[", to_toml(toml))
