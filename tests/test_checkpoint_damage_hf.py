"""A real `hf:` run's checkpoints, one byte of a shard flipped: `export-hf` of that checkpoint
refuses in one line and writes nothing (of the folder, it exports the older intact one with one
warning line), `run --resume` goes back to the older intact checkpoint with one warning
line and trains on as a run from there does. Also `--resume` through whole runs where no
checkpoint exists: `yes` says in one line that it starts from step 0, `require` refuses.

Everything is real: a tiny Llama built from its config with random weights, two ranks over gloo
on 127.0.0.1, the checkpoints `run` writes, the `octopipe` command's own entry point.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bad_inputs_second import flip_byte
from executor_helpers import SGD_FLAGS, one_f_one_b
from model_zoo import write_hf_config

from octopipe.cli import main
from octopipe.plan import save_plan
from octopipe.runtime.model.load import load_recipe

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if "warning" in line]


@pytest.fixture()
def run_argv(tmp_path):
    spec = f"hf:{write_hf_config(tmp_path / 'llama', 'llama').parent}"
    layers = load_recipe(spec).layers
    plan = tmp_path / "plan.json"
    save_plan(one_f_one_b(2, 2, num_layers=len(layers)).with_layer_names(layers), plan)

    def argv(ckpt: Path, *extra: str) -> list[str]:
        base = ["run", "--plan", str(plan), "--model", spec, "--seq-len", "8"]
        return [*base, *SGD_FLAGS, "--checkpoint-dir", str(ckpt), "--json", *extra]

    return spec, argv


@pytest.mark.slow  # three runs of two ranks
@pytest.mark.timeout(600)
def test_a_flipped_byte_in_a_trained_hf_checkpoint(tmp_path, run_argv, capsys):
    spec, argv = run_argv
    ckpt = tmp_path / "ckpt"
    # --resume where nothing was saved yet: one warning, then a whole run from step 0.
    assert main(argv(ckpt, "--steps", "4", "--checkpoint-every", "2", "--resume")) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert _warnings(captured.err) == [
        f"octopipe run: warning: --resume: no checkpoint in {ckpt} (no step-K folder); "
        "starting from step 0"
    ]
    straight = json.loads(captured.out.splitlines()[-1])
    assert straight["first_step"] == 0 and len(straight["losses"]) == 4
    assert sorted(p.name for p in ckpt.glob("step-*")) == ["step-2", "step-4"]

    shard = sorted((ckpt / "step-4").glob("*.distcp"))[-1]
    flip_byte(shard)

    # The damaged checkpoint named: refused in one line, nothing written.
    out = tmp_path / "exported"
    export = ["export-hf", "--model", spec, "-o", str(out), "--checkpoint"]
    assert main([*export, str(ckpt / "step-4")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert err[0].startswith(
        f"octopipe export-hf: error: {shard}: its bytes changed since the save"
    )
    assert not out.exists()
    # The folder named: its newest checkpoint is the damaged one, refused naming the intact
    # one, which then exports by its own path (FORMATS.md).
    assert main([*export, str(ckpt)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{shard}: its bytes changed" in err[0], err
    assert err[0].endswith(f"give --checkpoint {ckpt / 'step-2'}")
    assert not out.exists()
    assert main([*export, str(ckpt / "step-2")]) == 0
    assert f"from {ckpt / 'step-2'} (2 steps)" in capsys.readouterr().out

    assert main(argv(ckpt, "--steps", "4", "--resume")) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    (warning,) = _warnings(captured.err)
    assert warning.startswith(
        f"octopipe run: warning: {shard}: its bytes changed since the save"
    ) and warning.endswith("; skipped for step-2")
    resumed = json.loads(captured.out.splitlines()[-1])
    assert resumed["first_step"] == 2
    # From step 2's intact weights the run retrains steps 3 and 4 as the first run did them.
    assert resumed["losses"] == pytest.approx(straight["losses"][2:], rel=1e-5)


@pytest.mark.slow  # it would start two ranks if it were not refused
@pytest.mark.timeout(300)
def test_resume_require_without_a_checkpoint_refuses_before_any_rank(tmp_path, run_argv, capsys):
    _, argv = run_argv
    ckpt = tmp_path / "none"
    assert main(argv(ckpt, "--steps", "2", "--resume", "require")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"octopipe run: error: --resume: require: no checkpoint in {ckpt} (no step-K folder)"
    ], err
    assert not ckpt.exists()  # the refused run leaves no folder behind
