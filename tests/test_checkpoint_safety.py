"""Opening a checkpoint never runs code: a crafted index (`.metadata`) or a key stored as
pickled bytes is refused in one line, before any rank starts and again in a rank's own load,
and nothing the file names is run. Each crafted file is first shown to run code through
torch's own reader, so the refusals are tested against files that would do harm."""

from __future__ import annotations

import json
import os
import pickle
import shlex
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from executor_helpers import TOY, gpipe

import octopipe as op
from octopipe.cli import main
from octopipe.errors import InputError
from octopipe.plan import save_plan
from octopipe.runtime.checkpoint import store as checkpoint
from octopipe.runtime.checkpoint.folder import choose
from octopipe.runtime.checkpoint.metadata import (
    ALLOWED_GLOBALS,
    DamagedCheckpoint,
    UnsafeCheckpoint,
    read_metadata,
)
from octopipe.runtime.model.load import load_recipe

# DCP warns that it runs in one process when no process group is up: these tests mean that.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


class _Touch:
    """Unpickling this runs a shell command that creates `path`."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.path))}",)


@pytest.fixture(scope="module")
def toy():
    return load_recipe(TOY)


def _marker(folder: Path, layers, step: int = 2) -> None:
    about = {"format": checkpoint.FORMAT, "step": step, "model": TOY, "layers": list(layers)}
    about["seed"] = 0
    (folder / checkpoint.MARKER).write_text(json.dumps(about))


def _real_state(recipe) -> dict[str, torch.Tensor]:
    model = recipe.whole(torch.device("cpu"), seed=0).part
    return {f"model.{k}": p.detach() for k, p in model.named_parameters()}


def crafted_index(root: Path, recipe, witness: Path) -> Path:
    """A checkpoint whose `.metadata` runs `touch witness` when unpickled."""
    folder = root / "step-2"
    folder.mkdir(parents=True)
    (folder / ".metadata").write_bytes(pickle.dumps(_Touch(witness)))
    _marker(folder, recipe.layers)
    return folder


def crafted_bytes_entry(root: Path, recipe, witness: Path) -> Path:
    """A checkpoint with a sound index that declares a parameter as pickled bytes, whose
    unpickling (DCP's default planner: torch.load(weights_only=False)) runs `touch witness`."""
    folder = root / "step-2"
    state: dict[str, object] = dict(_real_state(recipe))
    first = next(iter(state))
    state[first] = _Touch(witness)
    dcp.save(state, checkpoint_id=str(folder), no_dist=True)
    _marker(folder, recipe.layers)
    return folder


def _run_argv(tmp_path: Path, ckpt: Path) -> list[str]:
    plan = tmp_path / "plan.json"
    save_plan(gpipe(2, 2), plan)
    return ["run", "--plan", str(plan), "--model", TOY, "--steps", "5", "--resume"] + [
        "--checkpoint-dir",
        str(ckpt),
    ]


def test_the_crafted_index_runs_code_through_torchs_own_reader(tmp_path, toy):
    witness = tmp_path / "ran"
    folder = crafted_index(tmp_path / "ckpt", toy, witness)
    with pytest.raises(AttributeError):  # torch's reader: it ran, then choked on the result
        dcp.FileSystemReader(str(folder)).read_metadata()
    assert witness.exists()


def test_the_crafted_bytes_entry_runs_code_through_dcps_default_load(tmp_path, toy):
    witness = tmp_path / "ran"
    folder = crafted_bytes_entry(tmp_path / "ckpt", toy, witness)
    dcp.load(_real_state(toy), checkpoint_id=str(folder), no_dist=True)
    assert witness.exists()


@pytest.mark.parametrize("craft", [crafted_index, crafted_bytes_entry])
def test_run_resume_refuses_a_crafted_checkpoint_in_one_line(tmp_path, toy, capsys, craft):
    witness = tmp_path / "ran"
    ckpt = tmp_path / "ckpt"
    craft(ckpt, toy, witness)
    assert main(_run_argv(tmp_path, ckpt)) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    meta = ckpt / "step-2" / ".metadata"
    if craft is crafted_index:
        assert err.strip() == (
            f"octopipe run: error: {meta}: refused to load: it names posix.system, which is "
            "no part of a checkpoint's metadata (opening a checkpoint never runs code)"
        )
    else:
        first = next(iter(_real_state(toy)))
        assert err.strip() == (
            f"octopipe run: error: {meta}: {first} is stored as pickled bytes, which loading "
            "would run as code; OctoPipe checkpoints hold tensors only"
        )
    assert not witness.exists()


@pytest.mark.filterwarnings("ignore::octopipe.runtime.checkpoint.folder.CheckpointUnverified")
@pytest.mark.parametrize("craft", [crafted_index, crafted_bytes_entry])
def test_the_python_api_refuses_a_crafted_checkpoint(tmp_path, toy, craft):
    witness = tmp_path / "ran"
    ckpt = tmp_path / "ckpt"
    craft(ckpt, toy, witness)
    with pytest.raises(UnsafeCheckpoint):
        op.run(gpipe(2, 2), TOY, steps=5, checkpoint_dir=ckpt, resume=True)
    assert not witness.exists()


@pytest.mark.parametrize("craft", [crafted_index, crafted_bytes_entry])
def test_a_ranks_own_load_refuses_a_crafted_checkpoint(tmp_path, toy, craft):
    """What a rank does if the folder changed after the launcher's check."""
    witness = tmp_path / "ran"
    folder = craft(tmp_path / "ckpt", toy, witness)
    modules = {0: toy.whole(torch.device("cpu"), seed=0)}
    with pytest.raises(UnsafeCheckpoint):
        checkpoint.load(folder, modules, None)
    assert not witness.exists()


def test_every_global_of_a_real_index_is_allowed_and_nothing_else_is_used(tmp_path, toy):
    """Momentum, Adam and bf16 state: what the index of a real checkpoint names is all in the
    allowlist, and every entry of the list but the refused-by-key bytes class is used."""
    model = toy.whole(torch.device("cpu"), seed=0).part
    state = {f"model.{k}": p.detach() for k, p in model.named_parameters()}
    state["optim.x.step"] = torch.tensor(3.0)
    state["optim.x.exp_avg"] = torch.zeros(4, dtype=torch.bfloat16)
    folder = tmp_path / "real"
    dcp.save(state, checkpoint_id=str(folder), no_dist=True)
    named = set()

    class Recording(pickle.Unpickler):
        def find_class(self, module, name):
            named.add((module, name))
            return super().find_class(module, name)

    with open(folder / ".metadata", "rb") as file:
        Recording(file).load()
    dtypes = {("torch", "float32"), ("torch", "bfloat16")}
    bytes_class = ("torch.distributed.checkpoint.metadata", "BytesStorageMetadata")
    assert named - dtypes == ALLOWED_GLOBALS - {bytes_class}
    assert set(read_metadata(folder).state_dict_metadata) == set(state)


def test_a_real_checkpoint_saves_and_loads_exactly_through_the_checked_reader(tmp_path, toy):
    """A world of one rank: save the model and its AdamW state, load both into a fresh copy."""
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        modules = {0: toy.whole(torch.device("cpu"), seed=0)}
        optimizer = torch.optim.AdamW(modules[0].parameters(), lr=0.1)
        for p in modules[0].parameters():
            p.grad = torch.ones_like(p)
        optimizer.step()
        about = {"model": TOY, "layers": list(toy.layers), "seed": 0}
        path = checkpoint.save(tmp_path / "ckpt", 1, modules, optimizer, about)
        fresh = {0: toy.whole(torch.device("cpu"), seed=1)}
        fresh_optimizer = torch.optim.AdamW(fresh[0].parameters(), lr=0.1)
        assert checkpoint.load(path, fresh, fresh_optimizer) == 1
    finally:
        dist.destroy_process_group()
    for (name, p), q in zip(modules[0].named_parameters(), fresh[0].parameters()):
        assert torch.equal(p, q), name
        for key, value in optimizer.state[p].items():
            assert torch.equal(value, fresh_optimizer.state[q][key]), (name, key)


@pytest.mark.parametrize(
    "content",
    [b"", b"\x80\x04garbage", pickle.dumps({"not": "metadata"})[:-3], pickle.dumps([1, 2])],
    ids=["empty", "garbage", "truncated", "other-object"],
)
def test_a_damaged_index_is_one_line(tmp_path, content):
    (tmp_path / ".metadata").write_bytes(content)
    with pytest.raises(DamagedCheckpoint) as caught:
        read_metadata(tmp_path)
    assert str(caught.value).startswith(f"{tmp_path / '.metadata'}: ")
    assert "\n" not in str(caught.value)


def test_a_shard_outside_the_checkpoint_folder_is_refused(tmp_path, toy):
    folder = tmp_path / "ckpt"
    dcp.save(_real_state(toy), checkpoint_id=str(folder), no_dist=True)
    index = read_metadata(folder)
    for info in index.storage_data.values():
        info.relative_path = "../../etc/passwd"
    (folder / ".metadata").write_bytes(pickle.dumps(index))
    with pytest.raises(DamagedCheckpoint, match="not a file of the checkpoint's folder"):
        read_metadata(folder)


@pytest.mark.filterwarnings("ignore::octopipe.runtime.checkpoint.folder.CheckpointUnverified")
def test_an_optimizer_state_larger_than_its_parameter_is_refused(tmp_path, toy):
    """An index may declare any size; a rank allocates state only of its parameters' shapes."""
    folder = tmp_path / "ckpt" / "step-2"
    state = _real_state(toy)
    first = next(iter(state)).removeprefix("model.")
    state[f"optim.{first}.exp_avg"] = torch.zeros(1000)
    dcp.save(state, checkpoint_id=str(folder), no_dist=True)
    _marker(folder, toy.layers)
    with pytest.raises(InputError, match=rf"optim\.{first}\.exp_avg is of shape \(1000,\)"):
        found = choose(folder.parent)
        checkpoint.check_compatible(
            found, toy.layers, toy.meta_model, seed=0, optimizer="sgd", model_id=TOY
        )


def test_the_planner_refuses_bytes_even_past_every_other_check(tmp_path, toy):
    """The last line of defence: DCP itself, handed the bytes entry, does not unpickle it."""
    from octopipe.runtime.checkpoint.metadata import CheckedReader, TensorsOnlyPlanner

    witness = tmp_path / "ran"
    folder = crafted_bytes_entry(tmp_path / "ckpt", toy, witness)
    reader = CheckedReader(folder, read_metadata(folder))
    from torch.distributed.checkpoint.api import CheckpointException

    with pytest.raises(CheckpointException) as caught:  # DCP wraps each rank's error
        dcp.load(
            _real_state(toy), storage_reader=reader, planner=TensorsOnlyPlanner(), no_dist=True
        )
    ((cause, _frames),) = caught.value.failures.values()  # per rank: its error and stack
    assert isinstance(cause, UnsafeCheckpoint) and "stored as pickled bytes" in str(cause)
    assert not witness.exists()
