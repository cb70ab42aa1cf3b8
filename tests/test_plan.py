import json

import pytest

from octopipe.actions import Action
from octopipe.errors import InputError
from octopipe.plan import load_plan, load_schedule_csv, save_plan, save_schedule_csv

FORMATS_EXAMPLE = {
    "format": "octopipe.plan/1",
    "num_devices": 2,
    "num_microbatches": 1,
    "stages": [{"layers": [0, 9], "device": 0}, {"layers": [9, 20], "device": 1}],
    "schedule": {"0": ["0F0", "0I0", "0W0"], "1": ["1F0", "1B0"]},
    "predicted": {"iteration_time": 1.25, "peak_memory_bytes": [1e9, 1e9], "bubble_ratio": 0.04},
}


def write(tmp_path, data):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    return path


def test_round_trip_json_and_csv(tmp_path):
    plan = load_plan(write(tmp_path, FORMATS_EXAMPLE), num_layers=20)
    assert plan.stages[1].start == 9 and plan.placement == (0, 1)
    assert plan.schedule[0] == (Action(0, "F", 0), Action(0, "I", 0), Action(0, "W", 0))
    save_plan(plan, tmp_path / "again.json")
    assert load_plan(tmp_path / "again.json") == plan
    assert json.loads((tmp_path / "again.json").read_text())["predicted"]["iteration_time"] == 1.25
    save_schedule_csv(plan, tmp_path / "s.csv")
    assert (tmp_path / "s.csv").read_text().splitlines() == ["0F0,0I0,0W0", "1F0,1B0"]
    assert load_schedule_csv(tmp_path / "s.csv") == dict(plan.schedule)


def test_action_notation():
    assert str(Action(12, "W", 3)) == "12W3"
    assert Action.parse("12W3") == Action(12, "W", 3)
    with pytest.raises(ValueError):
        Action.parse("1X0")


def _with(**kw):
    data = json.loads(json.dumps(FORMATS_EXAMPLE))
    data.update(kw)
    return data


@pytest.mark.parametrize(
    "data, place, words",
    [
        (_with(num_devices=0), "num_devices", "positive integer"),
        (
            _with(stages=[{"layers": [0, 9], "device": 0}, {"layers": [10, 20], "device": 1}]),
            "stages[1].layers",
            "expected 9",
        ),
        (
            _with(stages=[{"layers": [0, 9], "device": 0}, {"layers": [9, 20], "device": 5}]),
            "stages[1].device",
            "out of range",
        ),
        (
            _with(schedule={"0": ["0F0", "0I0", "0W0"], "1": ["1F0", "bad"]}),
            "schedule.1[1]",
            "bad action",
        ),
        (
            _with(schedule={"0": ["0F0", "0I0", "0W0", "1F0"], "1": ["1F0", "1B0"]}),
            "schedule.0[3]",
            "placed on device 1",
        ),
        (
            _with(schedule={"0": ["0F0", "0I0"], "1": ["1F0", "1B0"]}),
            "schedule",
            "needs B, or I and W",
        ),
        (
            _with(schedule={"0": ["0F0", "0I0", "0W0", "0F0"], "1": ["1F0", "1B0"]}),
            "schedule.0[3]",
            "twice",
        ),
        (
            _with(schedule={"0": ["0F0", "0F1", "0I0", "0W0"], "1": ["1F0", "1B0"]}),
            "schedule.0[1]",
            "microbatch 1 out of range",
        ),
        (_with(schedule={"0": ["0I0", "0W0"], "1": ["1F0", "1B0"]}), "schedule", "0F0 is missing"),
    ],
)
def test_bad_plans_give_one_line(tmp_path, data, place, words):
    path = write(tmp_path, data)
    with pytest.raises(InputError) as err:
        load_plan(path)
    msg = str(err.value)
    assert "\n" not in msg and f"{path}: {place}: " in msg and words in msg


@pytest.mark.parametrize(
    "schedule, words",
    [
        ({"\u00b2": ["0F0"]}, "device key must be a device index"),
        ({"0": ["0F0", "0I0", "0W0"], "1": ["1F0", "1B0"], "01": ["1B0", "1F0"]}, "listed twice"),
    ],
)
def test_device_keys_are_plain_and_unique(tmp_path, schedule, words):
    with pytest.raises(InputError, match=words):
        load_plan(write(tmp_path, _with(schedule=schedule)))


def test_plan_for_other_layer_count(tmp_path):
    with pytest.raises(InputError, match="cover 20 layers but the profile has 24"):
        load_plan(write(tmp_path, FORMATS_EXAMPLE), num_layers=24)
