import json

import pytest

from octopipe.errors import InputError
from octopipe.profile import load_profile, save_profile
from tests.sim_helpers import uniform_profile

GOOD = {
    "format": "octopipe.profile/1",
    "name": "gemma2-9b-tp4-h100",
    "layers": [
        {
            "name": "embed",
            "kind": "embedding",
            "f": 0.0004,
            "b": 0.0,
            "w": 0.0011,
            "act_bytes": 0,
            "wact_bytes": 0,
            "param_bytes": 5505024000,
            "out_bytes": 58720256,
        },
        {
            "name": "layers.0",
            "kind": "decoder",
            "f": 0.001,
            "b": 0.001,
            "w": 0.001,
            "act_bytes": 100,
            "wact_bytes": 50,
            "param_bytes": 10,
            "out_bytes": 58720256,
        },
    ],
    "devices": [{"speed": 1.0, "memory_bytes": 85899345920}],
    "link": {"bandwidth": 50e9, "latency": 1e-5},
    "unknown_key": "readers ignore it",
}


def write(tmp_path, data, name="p.json"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_design_example_round_trips(tmp_path):
    prof = load_profile(write(tmp_path, GOOD))
    assert prof.layers[0].param_bytes == 5505024000
    assert prof.devices[0].memory_bytes == 85899345920
    out = tmp_path / "again.json"
    save_profile(prof, out)
    again = load_profile(out)
    assert again == prof
    assert json.loads(out.read_text())["format"] == "octopipe.profile/1"


def test_optional_devices_and_link_may_be_absent(tmp_path):
    data = {k: v for k, v in GOOD.items() if k not in ("devices", "link")}
    prof = load_profile(write(tmp_path, data))
    assert prof.devices is None and prof.link.latency == 0
    save_profile(prof, tmp_path / "o.json")
    assert "devices" not in json.loads((tmp_path / "o.json").read_text())


def _bad(**change):
    data = json.loads(json.dumps(GOOD))
    for path, value in change.items():
        target = data
        keys = path.split("__")
        for k in keys[:-1]:
            target = target[int(k)] if k.isdigit() else target[k]
        last = keys[-1]
        if value is ...:
            del target[int(last) if last.isdigit() else last]
        else:
            target[int(last) if last.isdigit() else last] = value
    return data


@pytest.mark.parametrize(
    "data, place, words",
    [
        ("{not json", "line 1", "malformed JSON"),
        (_bad(layers__1__f=...), "layers[1].f", "missing"),
        (_bad(layers__1__f=-1.0), "layers[1].f", "greater than or equal"),
        (_bad(layers__1__wact_bytes=101), "layers[1]", "exceeds act_bytes"),
        (_bad(layers=[]), "layers", "empty"),
        (_bad(devices__0__speed=0), "devices[0].speed", "greater than or equal to 0.000001"),
        (json.dumps(GOOD).replace('"f": 0.001', '"f": Infinity'), None, "Infinity is not a"),
        (_bad(format="octopipe.profile/9"), "format", "unknown format"),
        ("[]", None, "expected a JSON object"),
    ],
)
def test_bad_profiles_give_one_line(tmp_path, data, place, words):
    path = write(tmp_path, data)
    with pytest.raises(InputError) as err:
        load_profile(path)
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg and words in msg
    if place:
        assert f": {place}: " in msg


def test_missing_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="cannot read"):
        load_profile(tmp_path / "nope.json")


def test_device_list_defaults_and_mismatch():
    prof = uniform_profile(4)
    assert len(prof.device_list(3)) == 3
    with pytest.raises(InputError, match="no devices"):
        prof.device_list()
    with pytest.raises(InputError, match="lists 2"):
        uniform_profile(4, devices=2).device_list(3)
