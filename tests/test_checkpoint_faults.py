"""Checkpoints that survive crashes, damage, full disks and a second run on the same folder.

Checkpoints here are real: written by `checkpoint.save` in a world of one rank (gloo, in this
process) or by `octopipe run`, then damaged the ways files get damaged (truncated, emptied,
garbled, a shard gone). Disk-full cases run on a small tmpfs, skipped where it cannot be mounted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
import warnings
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from executor_helpers import SGD_FLAGS, TOY, gpipe

from octopipe.cli import main
from octopipe.errors import InputError, OctoPipeWarning
from octopipe.plan import save_plan
from octopipe.runtime.checkpoint import store as checkpoint
from octopipe.runtime.checkpoint.folder import (
    LOCK,
    CheckpointSkipped,
    CheckpointUnverified,
    NoSpace,
    checkpoint_bytes,
    choose,
    hold,
)
from octopipe.runtime.model.load import load_recipe

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


@pytest.fixture(scope="module")
def toy():
    return load_recipe(TOY)


@contextmanager
def one_rank(tmp_path: Path):
    """A process group of this process alone, for `checkpoint.save`'s collectives."""
    store = tmp_path / f"store-{uuid.uuid4().hex}"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def write_checkpoints(root: Path, recipe, steps, optimizer: str = "sgd", seed: int = 0) -> None:
    """Real checkpoints of the toy model after each of `steps`, as a run writes them."""
    modules = {0: recipe.whole(torch.device("cpu"), seed=seed)}
    opt = torch.optim.SGD(modules[0].parameters(), lr=0.1, momentum=0.9)
    about = {"model": TOY, "model_id": TOY, "layers": list(recipe.layers), "seed": seed}
    about["optimizer"] = optimizer
    with one_rank(root.parent):
        for step in steps:
            for p in modules[0].parameters():
                p.grad = torch.full_like(p, 0.01 * step)
            opt.step()
            checkpoint.save(root, step, modules, opt, about, nbytes=1)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _shard(folder: Path) -> Path:
    return next(folder.glob("*.distcp"))


def flip_byte(path: Path, at: float = 0.5) -> None:
    """One byte of `path` changed in place (its length kept): what a bad disk or copy does."""
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0x01
    path.write_bytes(bytes(data))


def _digest_of_another(folder: Path) -> None:
    marker = json.loads((folder / "octopipe.json").read_text())
    name = next(iter(marker["checksums"]))
    _edit_marker(folder, checksums={**marker["checksums"], name: "sha256:" + "0" * 64})


DAMAGES = {
    "marker emptied": lambda f: (f / "octopipe.json").write_text(""),
    "marker truncated": lambda f: _truncate(f / "octopipe.json"),
    "marker garbled": lambda f: (f / "octopipe.json").write_bytes(b"\x00\xff{]"),
    "marker removed": lambda f: (f / "octopipe.json").unlink(),
    "marker says step 0": lambda f: _edit_marker(f, step=0),
    "marker says step -5": lambda f: _edit_marker(f, step=-5),
    "marker step as text": lambda f: _edit_marker(f, step="4"),
    "index emptied": lambda f: (f / ".metadata").write_bytes(b""),
    "index truncated": lambda f: _truncate(f / ".metadata"),
    "index garbled": lambda f: (f / ".metadata").write_bytes(os.urandom(64)),
    "shard removed": lambda f: _shard(f).unlink(),
    "shard truncated": lambda f: _truncate(_shard(f)),
    "shard byte flipped": lambda f: flip_byte(_shard(f)),
    "shard's last byte flipped": lambda f: flip_byte(_shard(f), at=0.9999999),
    "index byte flipped": lambda f: flip_byte(f / ".metadata", at=0.9),
    "marker checksum of another file": _digest_of_another,
    "marker checksum not hex": lambda f: _edit_marker(f, checksums={".metadata": "sha256:xyz"}),
    "marker checksum names a path": lambda f: _edit_marker(
        f, checksums={"../x": "sha256:" + "0" * 64}
    ),
    "marker checksums lack a shard": lambda f: _edit_marker(
        f, checksums={".metadata": "sha256:" + "0" * 64}
    ),
    "marker checksums as list": lambda f: _edit_marker(f, checksums=["sha256:0"]),
}


def _edit_marker(folder: Path, **changes) -> None:
    path = folder / "octopipe.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.mark.parametrize("damage", DAMAGES, ids=list(DAMAGES))
def test_a_damaged_latest_checkpoint_is_skipped_with_one_warning(tmp_path, toy, damage):
    root = tmp_path / "ckpt"
    write_checkpoints(root, toy, [2, 4])
    DAMAGES[damage](root / "step-4")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = choose(root)
    assert (found.path, found.step) == (root / "step-2", 2)
    (warning,) = caught
    assert warning.category is CheckpointSkipped
    text = str(warning.message)
    assert text.startswith(str(root / "step-4")) and text.endswith("; skipped for step-2")
    assert "\n" not in text


def test_a_changed_byte_is_found_by_its_checksum(tmp_path, toy):
    root = tmp_path / "ckpt"
    write_checkpoints(root, toy, [2])
    marker = json.loads((root / "step-2" / "octopipe.json").read_text())
    saved = sorted(p.name for p in (root / "step-2").iterdir() if p.name != "octopipe.json")
    assert sorted(marker["checksums"]) == saved  # every shard and the index
    assert choose(root).step == 2
    shard = _shard(root / "step-2")
    size = shard.stat().st_size
    flip_byte(shard)
    assert shard.stat().st_size == size  # every earlier check passes: the length is right
    with pytest.raises(InputError, match=r"its bytes changed since the save \(sha256 "):
        choose(root)


def test_a_checkpoint_without_checksums_still_resumes(tmp_path, toy):
    """Checkpoints written before checksums existed have no `checksums` key: not checked."""
    root = tmp_path / "ckpt"
    write_checkpoints(root, toy, [2])
    path = root / "step-2" / "octopipe.json"
    marker = json.loads(path.read_text())
    del marker["checksums"]
    path.write_text(json.dumps(marker))
    flip_byte(_shard(root / "step-2"))  # unseen, as before checksums: but said so
    with pytest.warns(CheckpointUnverified, match="carries no checksums, so its bytes were not"):
        found = choose(root)
    assert (found.step, found.marker.checksums) == (2, None)


def test_no_complete_checkpoint_is_one_refusal_and_an_empty_folder_starts_afresh(tmp_path, toy):
    root = tmp_path / "ckpt"
    assert choose(root) is None
    write_checkpoints(root, toy, [2])
    DAMAGES["shard removed"](root / "step-2")
    with pytest.raises(InputError, match=r"--resume: no complete checkpoint in .*shard is missing"):
        choose(root)


def test_a_save_is_renamed_into_place_whole_and_clears_what_a_crash_left(tmp_path, toy):
    root = tmp_path / "ckpt"
    root.mkdir()
    crashed = root / ".step-6.partial"  # a save killed halfway
    crashed.mkdir()
    (crashed / "__0_0.distcp").write_bytes(b"half")
    write_checkpoints(root, toy, [2])
    assert sorted(p.name for p in root.iterdir()) == ["step-2"]
    assert choose(root).step == 2


def test_a_damaged_checkpoint_of_the_same_step_is_replaced(tmp_path, toy):
    root = tmp_path / "ckpt"
    write_checkpoints(root, toy, [2])
    DAMAGES["index garbled"](root / "step-2")
    write_checkpoints(root, toy, [2])
    assert choose(root).step == 2 and sorted(p.name for p in root.iterdir()) == ["step-2"]


def test_checkpoint_files_are_not_writable_by_others_whatever_the_umask(tmp_path, toy):
    previous = os.umask(0)
    try:
        write_checkpoints(tmp_path / "ckpt", toy, [2])
    finally:
        os.umask(previous)
    folder = tmp_path / "ckpt" / "step-2"
    for item in [folder, *folder.iterdir()]:
        assert item.stat().st_mode & 0o022 == 0, item


def test_the_estimate_covers_what_a_checkpoint_takes(tmp_path, toy):
    write_checkpoints(tmp_path / "ckpt", toy, [2])
    taken = sum(p.stat().st_size for p in (tmp_path / "ckpt" / "step-2").iterdir())
    estimate = checkpoint_bytes(toy.meta_model, "sgd", momentum=0.9)
    assert taken <= estimate <= 3 * taken


# --- a run on the folder ------------------------------------------------------------------------


@pytest.fixture
def run_argv(tmp_path):
    plan = tmp_path / "plan.json"
    save_plan(gpipe(2, 2), plan)

    def argv(ckpt, *extra):
        base = ["run", "--plan", str(plan), "--model", TOY, "--checkpoint-dir", str(ckpt)]
        return [*base, *SGD_FLAGS, *extra]

    return argv


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


def test_a_second_run_on_a_held_folder_is_refused_naming_the_holder(tmp_path, run_argv, capsys):
    ckpt = tmp_path / "ckpt"
    with hold(ckpt):
        assert main(run_argv(ckpt, "--checkpoint-every", "1")) == 2
        line = _one_line(capsys)
    assert line.startswith(f"octopipe run: error: --checkpoint-dir: {ckpt} is in use by another ")
    assert f"pid {os.getpid()} on " in line and f"remove {ckpt / LOCK}" in line


def test_a_lock_left_by_a_killed_run_does_not_block_the_next(tmp_path):
    ckpt = tmp_path / "ckpt"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from octopipe.runtime.checkpoint.folder import hold\n"
            f"with hold({str(ckpt)!r}):\n    print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(InputError, match=f"pid {holder.pid} on "):
            with hold(ckpt):
                pass
    finally:
        holder.kill()
        holder.wait()
    assert json.loads((ckpt / LOCK).read_text())["pid"] == holder.pid  # its record is left
    with hold(ckpt):  # and yet the folder is free: the kernel dropped the dead run's lock
        pass


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--seed", "1"],
            "--seed: {ckpt}/step-2 was trained with --seed 0; resume with it (got 1)",
        ),
        (
            ["--optimizer", "adamw"],
            "--optimizer: {ckpt}/step-2 holds sgd state; resume with it (got adamw)",
        ),
        (["--steps", "2"], "--steps: {ckpt}/step-2 is at step 2; --steps 2 is done"),
    ],
    ids=["seed", "optimizer", "steps"],
)
def test_resuming_with_other_settings_is_refused_before_any_rank_starts(
    tmp_path, toy, run_argv, capsys, flags, message
):
    ckpt = tmp_path / "ckpt"
    write_checkpoints(ckpt, toy, [2])
    assert main(run_argv(ckpt, "--resume", "--steps", "4", *flags)) == 2
    assert _one_line(capsys) == f"octopipe run: error: {message.format(ckpt=ckpt)}"


def test_resuming_another_models_checkpoint_is_refused(tmp_path, toy, run_argv, capsys):
    ckpt = tmp_path / "ckpt"
    write_checkpoints(ckpt, toy, [2])
    _edit_marker(ckpt / "step-2", model_id="sha256:0123456789abcdef", model="other.json")
    assert main(run_argv(ckpt, "--resume", "--steps", "4")) == 2
    assert _one_line(capsys) == (
        f"octopipe run: error: --model: {ckpt}/step-2 was written by another model "
        f"(other.json): {TOY} differs"
    )


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--checkpoint-dir", "{file}", "--resume"],
            "--checkpoint-dir: {file} is a file, not a folder",
        ),
        (
            ["--checkpoint-dir", "{file}/sub", "--checkpoint-every", "1"],
            "--checkpoint-dir: {file} is a file, not a folder",
        ),
        (
            ["--png", "{tmp}/t.gif"],
            "--png: {tmp}/t.gif must end in .png or .svg (it says what is written)",
        ),
        (
            ["--trace", "{tmp}/t.txt"],
            "--trace: {tmp}/t.txt must end in .json (it says what is written)",
        ),
    ],
    ids=["dir-is-a-file", "dir-under-a-file", "png-extension", "trace-extension"],
)
def test_output_paths_are_checked_before_any_rank_starts(
    tmp_path, run_argv, capsys, flags, message
):
    file = tmp_path / "a-file"
    file.write_text("x")
    names = {"file": file, "tmp": tmp_path}
    plan = run_argv(tmp_path / "unused")[:5]  # run --plan P --model M
    assert main([*plan, *(f.format(**names) for f in flags)]) == 2
    assert _one_line(capsys) == f"octopipe run: error: {message.format(**names)}"


# --- a full disk --------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of 48 KiB: room for the toy model's checkpoint without momentum, not with."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(mount)], capture_output=True
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_disk_too_small_for_a_checkpoint_is_refused_before_any_rank(small_disk, run_argv, capsys):
    ckpt = small_disk / "ckpt"
    argv = run_argv(ckpt, "--checkpoint-every", "1", "--optimizer", "adamw")
    assert main(argv) == 2
    line = _one_line(capsys)
    nbytes = checkpoint_bytes(load_recipe(TOY).meta_model, "adamw")
    assert line.startswith(f"octopipe run: error: no space for a checkpoint in {ckpt} (")
    assert line.endswith(f"bytes free): it needs about {nbytes:,} bytes")


def test_a_disk_that_fills_during_a_save_is_one_line_and_leaves_no_partial_folder(
    small_disk, toy, monkeypatch
):
    """The free-space check is told there is room (as when another writer fills the disk
    meanwhile): the write itself runs out, and says so."""
    ballast = small_disk / "ballast"
    ballast.write_bytes(b"\0" * 40 * 1024)
    monkeypatch.setattr(checkpoint, "check_room", lambda *args, **kw: None)
    root = small_disk / "ckpt"
    with pytest.raises(NoSpace) as caught:
        write_checkpoints(root, toy, [2])
    assert str(caught.value).startswith(f"no space for the checkpoint of step 2 in {root}")
    assert "\n" not in str(caught.value)
    assert list(root.iterdir()) == []


@pytest.mark.slow  # a real process group
@pytest.mark.timeout(300)
@pytest.mark.parametrize("damage", ["shard truncated", "shard byte flipped"])
def test_a_run_resumes_from_the_last_complete_checkpoint_when_the_latest_is_damaged(
    tmp_path, run_argv, capsys, damage
):
    from octopipe.runtime.job.run_config import RunConfig
    from octopipe.runtime.reference import train_reference
    from octopipe.runtime.step.optim import OptimizerConfig

    ckpt = tmp_path / "ckpt"
    assert main(run_argv(ckpt, "--steps", "4", "--checkpoint-every", "2", "--json")) == 0
    capsys.readouterr()
    DAMAGES[damage](ckpt / "step-4")
    assert main(run_argv(ckpt, "--steps", "6", "--resume", "--json")) == 0
    captured = capsys.readouterr()
    warning = [line for line in captured.err.splitlines() if "warning" in line]
    fault = "shard holds " if damage == "shard truncated" else "its bytes changed since the save"
    assert len(warning) == 1, captured.err
    assert warning[0].startswith(f"octopipe run: warning: {_shard(ckpt / 'step-4')}: {fault}")
    assert warning[0].endswith("; skipped for step-2")
    summary = json.loads(captured.out.splitlines()[-1])
    straight = train_reference(
        RunConfig(TOY, steps=6, optimizer=OptimizerConfig("sgd", lr=0.01, total_steps=6)), 2
    )
    assert summary["first_step"] == 2
    assert summary["losses"] == pytest.approx(straight.losses[2:], rel=1e-5)


@pytest.mark.slow  # a real process group
@pytest.mark.timeout(300)
def test_a_run_that_fills_its_disk_stops_in_one_line_keeping_its_complete_checkpoints(
    tmp_path, run_argv, capsys
):
    """128 KiB: room for the first checkpoints, then not for the next; every rank stops at
    that save, and the run says so in one line (the ranks' refusal), exit 2."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(mount)])
    if made.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        ckpt = mount / "ckpt"
        assert main(run_argv(ckpt, "--steps", "20", "--checkpoint-every", "1")) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert "Traceback" not in "\n".join(err)
        nbytes = checkpoint_bytes(load_recipe(TOY).meta_model, "sgd")
        last = err[-1]
        assert (
            last.startswith("octopipe run: rank ")
            and ": no space for the checkpoint of step " in last
        )
        assert last.endswith(f"bytes free): it needs about {nbytes:,} bytes")
        kept = sorted(int(p.name[5:]) for p in ckpt.glob("step-*"))
        assert kept == list(range(1, len(kept) + 1)) and kept  # every one up to the full disk
        assert choose(ckpt).step == kept[-1] and not list(ckpt.glob(".step-*"))
    finally:
        subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.parametrize("folder", ["absent", "empty", "step-4 a file"])
def test_resume_without_a_checkpoint_says_it_starts_from_step_0_or_refuses_if_required(
    tmp_path, toy, folder
):
    from octopipe.runtime.job.run_config import Checkpointing, RunConfig
    from octopipe.runtime.launch.preflight import check_resumable

    root = tmp_path / "ckpt"
    if folder != "absent":
        root.mkdir()
    if folder == "step-4 a file":
        (root / "step-4").write_text("not a checkpoint")
    config = RunConfig(TOY, checkpoint=Checkpointing(dir=str(root), resume=True))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert check_resumable(config, toy).checkpoint.chosen is None
    (warning,) = [w for w in caught if issubclass(w.category, OctoPipeWarning)]
    assert str(warning.message) == (
        f"--resume: no checkpoint in {root} (no step-K folder); starting from step 0"
    )
    required = RunConfig(TOY, checkpoint=Checkpointing(dir=str(root), resume=True, required=True))
    with pytest.raises(InputError, match=r"--resume: require: no checkpoint in .* \(no step-K"):
        check_resumable(required, toy)
