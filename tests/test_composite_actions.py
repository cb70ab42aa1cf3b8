"""torch's composite schedule entries, `(0F7;7B3)OVERLAP_F_B`: load, simulate, round-trip.

The orders come from torch's own ScheduleDualPipeV (built over stand-in stages, as in
test_torch_parity.py), written as the CSV rows torch's `_PipelineScheduleRuntime` reads.
"""

from __future__ import annotations

import csv
import dataclasses
import json

import pytest
import torch.distributed.pipelining.schedules as tps
from sim_helpers import uniform_profile
from test_torch_parity import _stand_in_stages

from octopipe.actions import Action, format_entry, parse_entry
from octopipe.cli import main
from octopipe.errors import InputError
from octopipe.plan import (
    load_plan,
    load_schedule_csv,
    load_schedule_entries,
    plan_from_dict,
    save_plan,
    save_schedule_csv,
)
from octopipe.profile import save_profile
from octopipe.schedules import generate
from octopipe.sim import simulate


def torch_dualpipev_rows(P: int, M: int) -> list[list[str]]:
    """Each rank's compute entries as torch writes them, composites included."""
    sched = tps.ScheduleDualPipeV(_stand_in_stages(P, [0, 2 * P - 1], 2 * P), M)
    compute = (tps.F, tps.B, tps.I, tps.W, tps.OVERLAP_F_B)
    return [
        [
            str(a)
            for a in sched.pipeline_order[rank]
            if a is not None and a.computation_type in compute
        ]
        for rank in range(P)
    ]


def plan_dict(rows: list[list[str]], P: int, M: int, layers_per_stage: int = 1) -> dict:
    stages = [
        {"layers": [s * layers_per_stage, (s + 1) * layers_per_stage], "device": d}
        for s, d in enumerate(generate("dualpipev", P, M).placement)
    ]
    schedule = {str(d): row for d, row in enumerate(rows)}
    return {"num_devices": P, "num_microbatches": M, "stages": stages, "schedule": schedule}


def test_an_entry_parses_to_its_parts_in_order_and_back():
    parts = parse_entry("(0F7;7B3)OVERLAP_F_B")
    assert parts == (Action(0, "F", 7), Action(7, "B", 3))
    assert format_entry(parts) == "(0F7;7B3)OVERLAP_F_B"
    assert parse_entry(" 2W0 ") == (Action(2, "W", 0),)


@pytest.mark.parametrize(
    "bad", ["(0F7)OVERLAP_F_B", "(0F7;7B3)OVERLAP_X", "(0F7;7Q3)OVERLAP_F_B", "()OVERLAP_F_B"]
)
def test_bad_composites_are_refused(bad):
    with pytest.raises(ValueError):
        parse_entry(bad)


@pytest.mark.parametrize("P,M", [(2, 4), (4, 8), (4, 10)])
def test_torch_dualpipev_order_simulates_as_its_parts(P, M):
    rows = torch_dualpipev_rows(P, M)
    assert any("OVERLAP_F_B" in e for row in rows for e in row)  # the case this is about
    plan = plan_from_dict(plan_dict(rows, P, M), "<torch>", num_layers=2 * P)
    profile = uniform_profile(2 * P)
    result = simulate(profile, plan)
    expanded = [a for row in rows for e in row for a in parse_entry(e)]
    assert len(result.events) == len(expanded)
    # Each device runs its entries' parts in the order written.
    for d, row in enumerate(rows):
        mine = [e.action for e in result.events if e.device == d]
        assert mine == [a for e in row for a in parse_entry(e)]
    assert result.iteration_time >= result.lower_bound


def test_plan_with_composites_round_trips_through_json_and_csv(tmp_path):
    P, M = 4, 8
    rows = torch_dualpipev_rows(P, M)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan_dict(rows, P, M)))
    plan = load_plan(path, num_layers=2 * P)
    save_plan(plan, tmp_path / "again.json")
    assert json.loads((tmp_path / "again.json").read_text())["schedule"] == {
        str(d): row for d, row in enumerate(rows)
    }
    save_schedule_csv(plan, tmp_path / "s.csv")
    with open(tmp_path / "s.csv", newline="") as fh:
        assert list(csv.reader(fh)) == rows
    entries = load_schedule_entries(tmp_path / "s.csv")
    assert [[format_entry(e) for e in entries[d]] for d in range(P)] == rows
    assert load_schedule_csv(tmp_path / "s.csv") == dict(plan.schedule)


def test_simulate_command_accepts_torch_dualpipev_plan(tmp_path, capsys):
    P, M = 4, 8
    (tmp_path / "plan.json").write_text(json.dumps(plan_dict(torch_dualpipev_rows(P, M), P, M)))
    save_profile(uniform_profile(2 * P), tmp_path / "profile.json")
    code = main(
        [
            "simulate",
            "--profile",
            str(tmp_path / "profile.json"),
            "--plan",
            str(tmp_path / "plan.json"),
            "--json",
        ]
    )
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["iteration_time"] > 0


def test_stage_of_a_composite_part_must_be_on_the_entry_device():
    P, M = 2, 4
    data = plan_dict(torch_dualpipev_rows(P, M), P, M)
    data["schedule"]["0"][0] = "(0F0;1F0)OVERLAP_F_B"  # stage 1 runs on device 1
    with pytest.raises(InputError, match="placed on device"):
        plan_from_dict(data, "<bad>", num_layers=2 * P)


def test_a_reordered_schedule_keeps_only_the_composites_it_did_not_break():
    P, M = 2, 4
    rows = torch_dualpipev_rows(P, M)
    plan = plan_from_dict(plan_dict(rows, P, M), "<torch>", num_layers=2 * P)
    d, (first, parts) = next(
        (d, (i, e)) for d in range(P) for i, e in enumerate(plan.entries(d)) if len(e) > 1
    )
    acts = list(plan.schedule[d])
    at = acts.index(parts[0])
    acts[at], acts[at + 1] = acts[at + 1], acts[at]  # swap the composite's two parts
    swapped = dataclasses.replace(plan, schedule={**plan.schedule, d: tuple(acts)})
    written = [format_entry(e) for e in swapped.entries(d)]
    assert format_entry(parts) not in written
    assert written[first : first + 2] == [str(parts[1]), str(parts[0])]
    others = [e for e in plan.entries(d) if len(e) > 1 and e != parts]
    assert all(format_entry(e) in written for e in others)  # the rest stay composites
