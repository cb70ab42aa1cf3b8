"""The public Python API (`import octopipe`): light to import, and what the CLI does."""

from __future__ import annotations

import math
import subprocess
import sys

import octopipe as op
from octopipe.cli import main


def test_import_loads_neither_torch_nor_matplotlib():
    code = (
        "import sys, octopipe; octopipe.simulate; octopipe.tune; octopipe.run; "
        "print(sorted(m for m in ('torch', 'matplotlib') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_export_resolves():
    for name in op.__all__:
        assert callable(getattr(op, name)), name


def test_profile_baseline_simulate_tune_save(tmp_path):
    profile = op.profile_from_config("tiny-llama", "h100", devices=2, seq_len=128)
    assert profile.num_layers > 2 and len(profile.devices) == 2
    plan = op.baseline(profile, "1f1b", "uniform", num_microbatches=4)
    result = op.simulate(profile, plan)
    assert result.iteration_time == plan.predicted["iteration_time"]
    tuned = op.tune(profile, 4, time_budget=math.inf)
    best_baseline = min(e.sim.iteration_time for e in tuned.baselines if e.sim.fits)
    assert tuned.best.sim.iteration_time <= best_baseline  # the never-worse promise
    assert {e.label for e in tuned.baselines} == {
        label for label, _ in op.all_baselines(profile, 4)
    }
    op.save_plan(tuned.best.plan, tmp_path / "plan.json")
    op.save_profile(profile, tmp_path / "profile.json")
    again = op.load_plan(tmp_path / "plan.json", num_layers=profile.num_layers)
    assert again == tuned.best.plan
    assert op.load_profile(tmp_path / "profile.json") == profile


def test_tune_without_baselines_still_returns_a_plan():
    profile = op.profile_from_config("tiny-llama", "h100", devices=2, seq_len=128)
    tuned = op.tune(profile, 4, with_baselines=False, time_budget=math.inf)
    assert tuned.baselines == () and tuned.best.sim.fits


def test_the_cli_writes_what_the_api_returns(tmp_path):
    out = tmp_path / "p.json"
    assert (
        main(["profile-arch", "tiny-llama", "--devices", "2", "--seq-len", "128", "-o", str(out)])
        == 0
    )
    assert op.load_profile(out) == op.profile_from_config("tiny-llama", devices=2, seq_len=128)
