"""Calibrating a profile from a run: the scale and per-action overhead that explain its op times,
per-stage ratios; the command reads a real executor trace."""

import json
import re
import shlex
from pathlib import Path

import pytest
from executor_helpers import greedy, layer_count
from sim_helpers import uniform_profile

from octopipe.actions import Action
from octopipe.calibrate import collect_durations, fit_run, scaled, stage_ratios, stage_scaled
from octopipe.cli import main
from octopipe.plan import load_plan, make_plan, save_plan
from octopipe.profile import load_profile, save_profile


def two_stage_plan():
    # Stage 0 (layers 0-2) splits its backward; stage 1 (layer 2-3) runs full B.
    orders = {0: ["0F0", "0I0", "0W0"], 1: ["1F0", "1B0"]}
    return make_plan(
        2, 1, [(0, 2), (2, 3)], [0, 1], {d: map(Action.parse, o) for d, o in orders.items()}
    )


def test_each_stage_takes_its_mean_in_run_time():
    profile = uniform_profile(3, f=1.0, b=2.0, w=0.5)
    durations = collect_durations(
        (Action.parse(a), t)
        for a, t in [("0F0", 3.0), ("0F1", 5.0), ("0I0", 2.0), ("0W0", 0.5), ("1B0", 5.0)]
    )
    plan = two_stage_plan()
    r0, r1 = stage_ratios(profile, plan, durations)
    assert (r0.f, r0.b, r0.w) == (2.0, 0.5, 0.5)  # F: mean 4.0 over 2 layers x 1.0
    assert (r1.f, r1.b, r1.w) == (1.0, 2.0, 2.0)  # no F measured; B: 5.0 over b + w = 2.5
    per_stage = stage_scaled(profile, plan, durations)
    assert [(x.f, x.b, x.w) for x in per_stage.layers] == [(2.0, 1.0, 0.25)] * 2 + [(1.0, 4.0, 1.0)]
    assert [x.act_bytes for x in per_stage.layers] == [x.act_bytes for x in profile.layers]


def test_scaled_profile_keeps_memory_and_names_itself_once():
    profile = uniform_profile(2, f=1.0, b=2.0, w=0.5)
    twice = scaled(scaled(profile, 2.0), 1.5)
    assert [(x.f, x.b, x.w) for x in twice.layers] == [(3.0, 6.0, 1.5)] * 2
    assert [x.act_bytes for x in twice.layers] == [x.act_bytes for x in profile.layers]
    assert twice.name == "uniform-calibrated"


def test_the_fit_recovers_a_scale_and_a_per_action_overhead():
    profile = uniform_profile(4, f=1.0, b=2.0, w=0.5)
    orders = {0: ["0F0", "0I0", "0W0"], 1: ["1F0", "2F0", "2B0", "1B0"]}
    plan = make_plan(
        2,
        1,
        [(0, 1), (1, 2), (2, 4)],
        [0, 1, 1],
        {d: map(Action.parse, o) for d, o in orders.items()},
    )
    profiled = {(0, "F"): 1.0, (0, "I"): 2.0, (0, "W"): 0.5, (1, "F"): 1.0, (1, "B"): 2.5}
    profiled |= {(2, "F"): 2.0, (2, "B"): 5.0}
    durations = {k: [1.1 * x + 0.2, 1.1 * x + 0.2] for k, x in profiled.items()}
    fit = fit_run(profile, plan, durations)
    assert fit.scale == pytest.approx(1.1) and fit.overhead == pytest.approx(0.2)
    assert fit.points == 7
    # Ops faster than profiled by a constant give no negative overhead: a scale alone.
    quicker = {k: [0.9 * x - 0.1] for k, x in profiled.items()}
    assert fit_run(profile, plan, quicker).overhead == 0.0


def test_the_profile_is_read_at_each_device_s_speed():
    from sim_helpers import one_f_one_b

    from octopipe.profile import Device
    from octopipe.sim import Simulator

    profile = uniform_profile(2).model_copy(update={"devices": (Device(), Device(speed=0.5))})
    plan = one_f_one_b(2, 2)
    simulated = Simulator(profile).run(plan)
    # A run that took exactly what the simulator says: scale 1, no overhead, ratios 1.
    durations = collect_durations((e.action, e.end - e.start) for e in simulated.events)
    fit = fit_run(profile, plan, durations)
    assert fit.scale == pytest.approx(1.0) and fit.overhead == pytest.approx(0.0, abs=1e-12)
    assert all(r.f == pytest.approx(1.0) for r in stage_ratios(profile, plan, durations))
    again = Simulator(stage_scaled(profile, plan, durations)).run(plan)
    assert again.iteration_time == pytest.approx(simulated.iteration_time)


def test_op_times_that_cannot_be_a_run_of_the_profile_are_refused():
    from octopipe.errors import InputError

    with pytest.raises(InputError, match="do not fit"):
        fit_run(uniform_profile(3), two_stage_plan(), {(0, "F"): [0.0], (1, "B"): [0.0]})


def test_actions_of_a_stage_the_plan_lacks_are_refused():
    from octopipe.errors import InputError

    with pytest.raises(InputError, match="stage 5"):
        fit_run(uniform_profile(3), two_stage_plan(), {(5, "F"): [1.0]})


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_calibrate_command_scales_to_the_traced_run(tmp_path, capsys):
    layers = layer_count("tiny-llama")
    profile = uniform_profile(layers, f=1e-3, b=1e-3, w=1e-3)
    plan = greedy([0, 1, 1, 0], 3, 2, backward=lambda s, m: "I" if m else "B", num_layers=layers)
    paths = {k: tmp_path / f"{k}.json" for k in ("profile", "plan", "trace", "out")}
    save_profile(profile, paths["profile"])
    save_plan(plan.with_predicted({"iteration_time": 0.01}), paths["plan"])
    argv = ["run", "--plan", str(paths["plan"]), "--model", "tiny-llama", "--steps", "3"]
    assert main([*argv, "--trace", str(paths["trace"])]) == 0
    ran = capsys.readouterr().out
    assert "plan predicted 10.00 ms (" in ran and "octopipe calibrate" in ran  # error, hint
    args = ["--profile", str(paths["profile"]), "--plan", str(paths["plan"])]
    code = main(["calibrate", *args, "--trace", str(paths["trace"]), "-o", str(paths["out"])])
    assert code == 0
    out = capsys.readouterr().out
    assert "in run / profile" in out and "--action-overhead" in out
    calibrated = load_profile(paths["out"])
    # The written profile is the given one times the fitted scale; the fit is that of the
    # trace's actions in steps 1 and 2 (the first step warms up).
    events = json.loads(paths["trace"].read_text())["traceEvents"]
    taken = collect_durations(
        (Action.parse(e["name"]), e["dur"] / 1e6)
        for e in events
        if e["ph"] == "X" and e["cat"] != "wait" and e["args"]["step"] > 0
    )
    fit = fit_run(profile, load_plan(paths["plan"]), taken)
    for mine, theirs in zip(calibrated.layers, profile.layers):
        assert mine.f == pytest.approx(theirs.f * fit.scale, rel=1e-6)
    assert f"{fit.overhead:.6f}" in out
    # The suggested next command works as printed (the profile lists no devices: the command
    # carries the plan's device and microbatch counts) and writes its folder.
    words = suggested_command(out)
    assert words[:2] == ["octopipe", "plan"] and "--devices" in words and "-o" in words
    assert main([*words[1:], "--quiet"]) == 0, capsys.readouterr().err
    folder = Path(words[words.index("-o") + 1])
    assert load_plan(folder / "plan.json").num_microbatches == plan.num_microbatches


def suggested_command(out: str) -> list[str]:
    """The words of the command `octopipe calibrate` prints between backticks."""
    return shlex.split(re.search(r"`(octopipe plan [^`]+)`", out).group(1))


def test_calibrate_command_refuses_a_trace_without_actions(tmp_path, capsys):
    profile, plan = uniform_profile(3), two_stage_plan()
    save_profile(profile, tmp_path / "p.json")
    save_plan(plan, tmp_path / "plan.json")
    (tmp_path / "t.json").write_text('{"traceEvents": []}')
    args = ["--profile", str(tmp_path / "p.json"), "--plan", str(tmp_path / "plan.json")]
    assert main(["calibrate", *args, "--trace", str(tmp_path / "t.json"), "-o", "x.json"]) == 2
    assert "no executor actions" in capsys.readouterr().err
