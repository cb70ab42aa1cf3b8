import json

import pytest

from octopipe.cli import main
from octopipe.plan import save_plan
from octopipe.profile import save_profile
from tests.sim_helpers import one_f_one_b, uniform_profile


@pytest.fixture
def files(tmp_path):
    save_profile(uniform_profile(4, devices=4), tmp_path / "p.json")
    save_plan(one_f_one_b(4, 8), tmp_path / "plan.json")
    return tmp_path


def test_simulate_json(files, capsys):
    assert (
        main(
            [
                "simulate",
                "--profile",
                str(files / "p.json"),
                "--plan",
                str(files / "plan.json"),
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["iteration_time"] == pytest.approx(33.0)
    assert out["bubble_ratio"] == pytest.approx(3 / 11)
    assert out["peak_memory_bytes"] == [140, 130, 120, 110]
    assert out["fits"] is True and out["efficiency"] == pytest.approx(8 / 11)


def test_simulate_table(files, capsys):
    assert (
        main(["simulate", "--profile", str(files / "p.json"), "--plan", str(files / "plan.json")])
        == 0
    )
    out = capsys.readouterr().out
    assert "bubble 27.3%" in out and "critical path" in out


def test_simulate_pictures(files):
    out = files / "t.svg"
    args = ["simulate", "--profile", str(files / "p.json"), "--plan", str(files / "plan.json")]
    assert main([*args, "--png", str(out), "--memory-png", str(files / "m.png")]) == 0
    assert out.read_text().count('id="action-d') == 4 * 8 * 2  # every F and B of 4 x 8
    assert (files / "m.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_html_and_trace(files, capsys):
    from octopipe.trace import load_events

    args = ["simulate", "--profile", str(files / "p.json"), "--plan", str(files / "plan.json")]
    page, trace = files / "t.html", files / "t.json"
    assert main([*args, "--json", "--html", str(page), "--trace", str(trace)]) == 0
    out, err = capsys.readouterr()
    json.loads(out)  # still one JSON object on stdout; the path written goes to stderr
    assert str(page) in err
    assert page.read_text().count('<rect id="action-d') == 4 * 8 * 2
    assert len(load_events(trace)) == 4 * 8 * 2


def test_unwritable_picture_is_one_line(files, capsys):
    args = ["simulate", "--profile", str(files / "p.json"), "--plan", str(files / "plan.json")]
    assert main([*args, "--png", str(files / "no" / "t.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"octopipe simulate: error: --png: folder {files / 'no'} does not exist"


def test_plan_for_another_profile_is_one_line(files, capsys):
    save_profile(uniform_profile(5, devices=4), files / "p5.json")
    assert (
        main(["simulate", "--profile", str(files / "p5.json"), "--plan", str(files / "plan.json")])
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert (
        err.count("\n") == 0
        and "plan.json: stages: stages cover 4 layers but the profile has 5" in err
    )


def test_deadlock_is_one_line(files, capsys):
    data = json.loads((files / "plan.json").read_text())
    data["schedule"]["3"] = list(reversed(data["schedule"]["3"]))
    (files / "bad.json").write_text(json.dumps(data))
    assert (
        main(["simulate", "--profile", str(files / "p.json"), "--plan", str(files / "bad.json")])
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "deadlock" in err and "waits for" in err
