"""Tests of octopipe.trace: one Chrome/Perfetto schema for simulated and measured runs, read
back as written, and the older layouts still read."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from octopipe import trace
from octopipe.actions import Action, Event
from octopipe.errors import InputError
from octopipe.sim import Simulator
from tests.viz_samples import interleaved_1f1b, layer_profile


@dataclass(frozen=True)
class Record:  # the fields of the executor's ActionRecord (runtime/step/worker.py)
    step: int
    action: str
    wait_start: float
    start: float
    end: float


RECORDS = (
    (
        Record(0, "0F0", 0.0, 0.0, 1.0),
        Record(0, "0B0", 2.0, 3.0, 5.0),
        Record(1, "0F0", 6.0, 6.0, 7.0),
    ),
    (Record(0, "1F0", 1.0, 1.5, 2.0), Record(0, "1B0", 2.0, 2.0, 3.0)),
)


def same(a: Event, b: Event) -> bool:
    return (a.device, a.action) == (b.device, b.action) and (a.start, a.end) == pytest.approx(
        (b.start, b.end), abs=1e-12
    )


@pytest.fixture(scope="module")
def simulated():
    return Simulator(layer_profile(8, 4)).run(interleaved_1f1b(4, 2, 8))


def test_simulated_events_round_trip(simulated, tmp_path):
    path = trace.write_trace(tmp_path / "sim.json", simulated.events, "simulated")
    back = trace.read_trace(path)
    assert len(back) == len(simulated.events)
    assert all(same(t.event, e) for t, e in zip(back, simulated.events))
    assert all(t.step is None and t.wait_start is None and t.wait == 0.0 for t in back)
    assert trace.load_events(path)[0] == back[0].event


def test_executor_records_round_trip_with_waits_and_steps(tmp_path):
    written = trace.from_records(RECORDS)
    path = trace.write_trace(tmp_path / "run.json", written, "measured")
    back = trace.read_trace(path)
    assert len(back) == len(written) == 5
    for a, b in zip(back, written):
        assert same(a.event, b.event) and a.step == b.step
        assert a.wait == pytest.approx(b.wait, abs=1e-12)
    assert [round(t.wait, 9) for t in back] == [0.0, 1.0, 0.0, 0.5, 0.0]
    # Only the waits that took time are events of their own.
    doc = json.loads(path.read_text())
    waits = [e for e in doc["traceEvents"] if e["name"] == "wait"]
    assert [(e["pid"], e["args"]) for e in waits] == [
        (0, {"step": 0, "action": "0B0"}),
        (1, {"step": 0, "action": "1F0"}),
    ]


def test_one_schema_for_both(simulated, tmp_path):
    sim = trace.trace_document(simulated.events, "simulated")
    run = trace.trace_document(trace.from_records(RECORDS), "measured")
    for doc in (sim, run):
        assert doc["format"] == trace.FORMAT and doc["displayTimeUnit"] == "ms"
        spans = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["name"] != "wait"]
        for span in spans:
            assert span["tid"] == 0 and span["cat"] == span["name"][len(str(span["args"]["stage"]))]
            assert set(span["args"]) - {"step"} == {"stage", "kind", "microbatch"}
    names = {e["pid"]: e["args"]["name"] for e in run["traceEvents"] if e["name"] == "process_name"}
    assert names == {0: "measured: device 0", 1: "measured: device 1"}


def test_microseconds_on_the_wire(simulated):
    doc = trace.trace_document(simulated.events)
    spans = {(e["pid"], e["name"]): e for e in doc["traceEvents"] if e["ph"] == "X"}
    for ev in simulated.events:
        span = spans[(ev.device, str(ev.action))]
        assert span["ts"] == pytest.approx(ev.start * 1e6)
        assert span["dur"] == pytest.approx((ev.end - ev.start) * 1e6)


def test_steps_filter_and_events_per_step(tmp_path):
    path = trace.write_trace(tmp_path / "run.json", trace.from_records(RECORDS))
    got = sorted((e.device, str(e.action), e.start, e.end) for e in trace.load_events(path, [0]))
    assert got == [
        (0, "0B0", 3.0, 5.0),
        (0, "0F0", 0.0, 1.0),
        (1, "1B0", 2.0, 3.0),
        (1, "1F0", 1.5, 2.0),
    ]
    per_step = trace.events_by_step(trace.read_trace(path))
    assert list(per_step) == [0, 1] and [str(e.action) for e in per_step[1]] == ["0F0"]


def test_old_simulator_layout_reads(simulated):
    """The simulator's former layout: one thread per device, the kind's name as category."""
    old = [
        {
            "ph": "M",
            "name": "process_name",
            "pid": 0,
            "tid": 0,
            "args": {"name": "octopipe: device 0"},
        },
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 0, "args": {"name": "compute"}},
    ]
    old += [
        {
            "name": str(e.action),
            "cat": "forward",
            "ph": "X",
            "ts": e.start * 1e6,
            "dur": (e.end - e.start) * 1e6,
            "pid": e.device,
            "tid": e.device,
            "args": {"stage": e.action.stage, "microbatch": e.action.mb, "kind": e.action.kind},
        }
        for e in simulated.events
    ]
    back = trace.parse_trace({"traceEvents": old, "displayTimeUnit": "ms"})
    assert all(same(t.event, e) for t, e in zip(back, simulated.events))


def test_old_executor_layout_reads_with_waits_and_steps():
    """The executor's former layout: the action only in the name, the step in args, waits
    without the action they precede, rank processes named "rank r"."""
    old = [
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "rank 0"}},
        {
            "name": "0F0",
            "cat": "F",
            "ph": "X",
            "pid": 0,
            "tid": 0,
            "ts": 0.0,
            "dur": 1e6,
            "args": {"step": 0},
        },
        {
            "name": "wait",
            "cat": "wait",
            "ph": "X",
            "pid": 0,
            "tid": 0,
            "ts": 2e6,
            "dur": 1e6,
            "args": {"step": 0},
        },
        {
            "name": "0B0",
            "cat": "B",
            "ph": "X",
            "pid": 0,
            "tid": 0,
            "ts": 3e6,
            "dur": 2e6,
            "args": {"step": 0},
        },
        {
            "name": "0F0",
            "cat": "F",
            "ph": "X",
            "pid": 0,
            "tid": 0,
            "ts": 6e6,
            "dur": 1e6,
            "args": {"step": 1},
        },
    ]
    back = trace.parse_trace({"traceEvents": old})
    assert [(str(t.event.action), t.step, t.wait) for t in back] == [
        ("0F0", 0, 0.0),
        ("0B0", 0, 1.0),
        ("0F0", 1, 0.0),
    ]
    assert [str(e.action) for e in trace.events_by_step(back)[1]] == ["0F0"]


def test_malformed_trace_names_the_event():
    bad = {
        "traceEvents": [
            {
                "ph": "X",
                "name": "0F0",
                "ts": "soon",
                "dur": 1,
                "pid": 0,
                "args": {"stage": 0, "microbatch": 0, "kind": "F"},
            }
        ]
    }
    with pytest.raises(InputError, match=r"traceEvents\[0\]"):
        trace.parse_trace(bad, "t.json")
    with pytest.raises(InputError, match="traceEvents"):
        trace.parse_trace({"events": []}, "t.json")


def test_measured_events_draw_as_text():
    from octopipe.viz.text import render_text_timeline

    events = [t.event for t in trace.from_records(RECORDS) if t.step == 0]
    lines = render_text_timeline(events, width=5).splitlines()
    assert lines[1:] == ["0 |F..BB|", "1 |.FB..|"]


def test_measured_clock_times_are_shifted_to_zero():
    events = [Event(1, Action(1, "F", 0), 101.0, 102.0), Event(0, Action(0, "F", 0), 100.0, 101.0)]
    norm = trace.normalized_events(events)
    assert [(e.device, e.start, e.end) for e in norm] == [(0, 0.0, 1.0), (1, 1.0, 2.0)]
