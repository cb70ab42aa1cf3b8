"""The precision a profile was priced in travels with it: the profile's optional `precision`
(and FP8 scaling) keys, and the plan's `profile.precision`, which `octopipe run` reads
(docs/FORMATS.md). A BF16 profile and plan are written as before the keys existed."""

from __future__ import annotations

import json

import pytest

from octopipe.api import baseline, profile_from_config
from octopipe.errors import InputError
from octopipe.plan import load_plan, save_plan
from octopipe.profile import load_profile, save_profile


@pytest.mark.parametrize(("precision", "scaling"), [("bf16", "delayed"), ("fp8", "current")])
def test_profile_and_plan_keep_the_precision(precision, scaling, tmp_path):
    prof = profile_from_config(
        "tiny-llama", devices=2, seq_len=64, precision=precision, fp8_scaling=scaling
    )
    save_profile(prof, tmp_path / "profile.json")
    raw = json.loads((tmp_path / "profile.json").read_text())
    assert ("precision" in raw) == (precision != "bf16")
    again = load_profile(tmp_path / "profile.json")
    assert (again.precision, again.fp8_scaling) == (precision, scaling)
    plan = baseline(prof, "1f1b", "uniform", 4).made_for(prof)
    save_plan(plan, tmp_path / "plan.json")
    made_for = json.loads((tmp_path / "plan.json").read_text())["profile"]
    assert made_for.get("precision") == (precision if precision != "bf16" else None)
    assert load_plan(tmp_path / "plan.json").made_for_value("precision") == made_for.get(
        "precision"
    )


def test_an_unknown_precision_in_a_plan_is_one_line(tmp_path):
    prof = profile_from_config("tiny-llama", devices=2, seq_len=64)
    save_plan(baseline(prof, "1f1b", "uniform", 4).made_for(prof), tmp_path / "plan.json")
    data = json.loads((tmp_path / "plan.json").read_text())
    data["profile"]["precision"] = "fp4"
    (tmp_path / "plan.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"profile\.precision.*expected one of bf16, fp8, mxfp8"):
        load_plan(tmp_path / "plan.json")
