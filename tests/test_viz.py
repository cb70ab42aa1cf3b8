"""Tests of octopipe.viz: timeline pictures, memory plots, Chrome traces, text timelines."""

from __future__ import annotations

import json
import struct
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from octopipe import viz
from octopipe.actions import Action, Event
from octopipe.errors import InputError
from octopipe.sim import Simulator
from tests.viz_samples import interleaved_1f1b, layer_profile, one_f_one_b, v_shape_greedy

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def png_inches(path: Path) -> tuple[float, float]:
    """Size in inches, from the pixel size and the pHYs density (pixels per metre)."""
    data = path.read_bytes()
    at = data.index(b"pHYs")
    per_metre_x, per_metre_y, unit = struct.unpack(">IIB", data[at + 4 : at + 13])
    assert unit == 1
    width, height = png_size(path)
    return width / per_metre_x / 0.0254, height / per_metre_y / 0.0254


def svg_action_ids(path: Path) -> list[str]:
    root = ET.parse(path).getroot()
    return [el.get("id") for el in root.iter() if (el.get("id") or "").startswith("action-")]


@pytest.fixture(scope="module")
def cases():
    """(profile, plan, result) for 1F1B, split 1F1B, interleaved and a V on uneven devices."""
    hetero = layer_profile(8, 4, speeds=[1.0, 1.0, 0.8, 1.25], memory_bytes=12 << 30)
    built = {
        "1f1b": (layer_profile(4, 4, head_scale=1.6), one_f_one_b(4, 8)),
        "split": (layer_profile(4, 4), one_f_one_b(4, 8, split=True)),
        "interleaved": (layer_profile(8, 4), interleaved_1f1b(4, 2, 8)),
        "vshape": (hetero, v_shape_greedy(hetero, 4, 8, max_in_flight=6)),
    }
    return {k: (prof, plan, Simulator(prof).run(plan)) for k, (prof, plan) in built.items()}


# --- pure helpers ---------------------------------------------------------------------------


def test_time_unit_keeps_ticks_short():
    assert viz.time_unit(2.5) == ("s", 1.0)
    assert viz.time_unit(0.0595) == ("ms", 1e3)
    assert viz.time_unit(2e-4) == ("µs", 1e6)


def test_label_font_shrinks_then_skips():
    wide = viz.label_font_size(40.0, 20.0, "7")
    narrow = viz.label_font_size(9.0, 20.0, "12")
    assert wide == 8.0
    assert narrow is not None and narrow < wide
    assert viz.label_font_size(4.0, 20.0, "127") is None
    assert viz.label_font_size(40.0, 3.0, "1") is None  # a row too thin for any text


def test_chunks_follow_stage_order_per_device(cases):
    *_, result = cases["vshape"]
    chunk = viz.chunk_indices(result.events)
    assert [chunk[s] for s in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_shade_lightens_later_chunks_only():
    base = viz.shade("#3D85C6", 0, 3)
    last = viz.shade("#3D85C6", 2, 3)
    assert base == pytest.approx(viz.shade("#3D85C6", 0, 1))
    assert all(b < l for b, l in zip(base, last))


def test_summary_from_bare_events_matches_the_simulator(cases):
    *_, result = cases["split"]
    from_events = viz.summarize(list(result.events))
    assert from_events.iteration_time == pytest.approx(result.iteration_time)
    assert from_events.bubble_ratio == pytest.approx(result.bubble_ratio)
    assert from_events.busy == pytest.approx(result.busy)
    assert from_events.efficiency is None


def test_measured_clock_times_are_shifted_to_zero():
    events = [Event(1, Action(1, "F", 0), 101.0, 102.0), Event(0, Action(0, "F", 0), 100.0, 101.0)]
    norm = viz.normalized_events(events)
    assert [(e.device, e.start, e.end) for e in norm] == [(0, 0.0, 1.0), (1, 1.0, 2.0)]


# --- timeline pictures ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["1f1b", "split", "interleaved", "vshape"])
def test_png_timeline_is_a_sized_png(cases, tmp_path, name):
    *_, result = cases[name]
    path = viz.save_timeline(result, tmp_path / f"{name}.png", title=name)
    width, height = png_size(path)
    assert 1000 <= width <= 2**16 and 300 <= height <= 2000
    assert width > height  # time runs along the long side


def test_svg_has_one_rectangle_per_action(cases, tmp_path):
    for name in ("interleaved", "vshape"):
        *_, result = cases[name]
        ids = svg_action_ids(viz.save_timeline(result, tmp_path / f"{name}.svg"))
        expected = [f"action-d{e.device}-{e.action}" for e in result.events]
        assert sorted(ids) == sorted(expected)


def test_picture_grows_with_devices_and_actions(tmp_path):
    small = Simulator(layer_profile(4, 4)).run(one_f_one_b(4, 8))
    tall = Simulator(layer_profile(8, 8)).run(one_f_one_b(8, 8))
    long = Simulator(layer_profile(4, 4)).run(one_f_one_b(4, 64))
    w0, h0 = png_inches(viz.save_timeline(small, tmp_path / "small.png"))
    w1, h1 = png_inches(viz.save_timeline(tall, tmp_path / "tall.png"))
    w2, h2 = png_inches(viz.save_timeline(long, tmp_path / "long.png"))
    assert h1 > h0 and h2 == pytest.approx(h0, abs=0.02)
    assert w2 > 2 * w0


@pytest.mark.parametrize("split", [False, True])
def test_32_devices_by_128_microbatches_stay_legible(split):
    """Layout only (drawing 12k boxes takes seconds): most boxes carry a readable label and
    the image stays within what Agg can draw."""
    result = Simulator(layer_profile(32, 32)).run(one_f_one_b(32, 128, split=split))
    events = viz.normalized_events(result)
    layout = viz.timeline_layout(events, result.iteration_time, result.num_devices)
    sizes = [layout.label_size(e) for e in events]
    labelled = [s for s in sizes if s is not None]
    assert len(labelled) >= 0.95 * len(events)
    assert min(labelled) >= 5.0
    width_px, height_px = layout.pixels
    assert width_px < 2**16 and height_px < 2**16
    assert layout.axes_height / result.num_devices >= 0.3  # inches per row


def test_zero_length_actions_do_not_shrink_the_others():
    """A first stage with no input gradient has I of length 0: the layout ignores them."""
    events = [Event(0, Action(0, "F", m), 2.0 * m, 2.0 * m + 1.0) for m in range(40)]
    events += [Event(0, Action(0, "I", m), 80.0 + m, 80.0 + m) for m in range(40)]
    layout = viz.timeline_layout(events, 120.0, 1)
    assert all(layout.label_size(e) is not None for e in events[:40])
    assert layout.axes_width > 8.0  # wider than the smallest picture: it scaled to the F boxes


def test_timeline_from_measured_events_without_stage_labels(cases, tmp_path):
    *_, result = cases["1f1b"]
    shifted = [Event(e.device, e.action, e.start + 5.0, e.end + 5.0) for e in result.events]
    path = viz.save_timeline(shifted, tmp_path / "measured.svg", stage_labels=False)
    assert len(svg_action_ids(path)) == len(result.events)
    # Matplotlib's SVG keeps each text as a comment beside its glyph paths.
    text = path.read_text()
    assert "stage 0" not in text and "efficiency" not in text  # no lower bound for bare events
    assert "bubble" in text
    labelled = viz.save_timeline(result, tmp_path / "simulated.svg").read_text()
    assert "stage 0" in labelled and "efficiency" in labelled


def test_unknown_picture_suffix_is_a_user_error(cases, tmp_path):
    *_, result = cases["1f1b"]
    with pytest.raises(InputError, match=r"\.jpg"):
        viz.save_timeline(result, tmp_path / "timeline.jpg")


def test_result_without_events_is_refused():
    profile = layer_profile(4, 4)
    result = Simulator(profile).run(one_f_one_b(4, 4), detail=False)
    with pytest.raises(ValueError, match="detail=True"):
        viz.normalized_events(result)


# --- memory --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["1f1b", "split", "interleaved", "vshape"])
def test_memory_curve_peaks_at_the_simulated_peak(cases, name):
    profile, plan, result = cases[name]
    traces = viz.memory_over_time(result, plan, profile)
    assert [t.peak_bytes for t in traces] == pytest.approx(result.peak_memory_bytes)
    for t in traces:
        assert t.bytes[-1] == t.static_bytes == min(t.bytes)  # all activations freed at the end
        assert list(t.times) == sorted(set(t.times))  # one step per instant


def test_memory_plot_writes_png_and_svg(cases, tmp_path):
    profile, plan, result = cases["vshape"]
    width, height = png_size(viz.save_memory_plot(result, plan, profile, tmp_path / "m.png"))
    assert width > 800 and height > 400
    ET.parse(viz.save_memory_plot(result, plan, profile, tmp_path / "m.svg"))


# --- Chrome / Perfetto trace ---------------------------------------------------------------


def test_chrome_trace_has_one_event_per_action_in_microseconds(cases, tmp_path):
    *_, result = cases["vshape"]
    path = viz.save_chrome_trace(result, tmp_path / "trace.json")
    data = json.loads(path.read_text())
    spans = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == len(result.events)
    by_name = {(e["pid"], e["name"]): e for e in spans}
    for ev in result.events:
        span = by_name[(ev.device, str(ev.action))]
        assert span["tid"] == ev.device
        assert span["ts"] == pytest.approx(ev.start * 1e6)
        assert span["dur"] == pytest.approx((ev.end - ev.start) * 1e6)
        assert span["args"] == {
            "stage": ev.action.stage,
            "microbatch": ev.action.mb,
            "kind": ev.action.kind,
        }


def test_chrome_trace_names_each_device(cases):
    *_, result = cases["1f1b"]
    meta = [e for e in viz.chrome_trace(result.events, "run 7")["traceEvents"] if e["ph"] == "M"]
    names = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert names == {d: f"run 7: device {d}" for d in range(4)}
    assert sum(e["name"] == "thread_name" for e in meta) == 4


def test_chrome_trace_round_trips_to_events(cases, tmp_path):
    *_, result = cases["interleaved"]
    path = viz.save_chrome_trace(result.events, tmp_path / "trace.json")
    back = viz.load_chrome_trace(path)
    assert [(e.device, e.action) for e in back] == [(e.device, e.action) for e in result.events]
    for a, b in zip(back, result.events):
        assert a.start == pytest.approx(b.start, abs=1e-12)
        assert a.end == pytest.approx(b.end, abs=1e-12)


def test_executor_trace_reads_as_events_of_one_step(tmp_path):
    trace = pytest.importorskip("octopipe.runtime.trace")
    from octopipe.runtime.worker import ActionRecord

    records = (
        (
            ActionRecord(0, "0F0", 0.0, 0.0, 1.0),
            ActionRecord(0, "0B0", 2.0, 3.0, 5.0),
            ActionRecord(1, "0F0", 6.0, 6.0, 7.0),
        ),
        (ActionRecord(0, "1F0", 1.0, 1.5, 2.0), ActionRecord(0, "1B0", 2.0, 2.0, 3.0)),
    )
    trace.write_trace(tmp_path / "run.json", records)
    events = viz.load_chrome_trace(tmp_path / "run.json", step=0)
    got = sorted((e.device, str(e.action), round(e.start, 9), round(e.end, 9)) for e in events)
    assert got == [
        (0, "0B0", 3.0, 5.0),
        (0, "0F0", 0.0, 1.0),
        (1, "1B0", 2.0, 3.0),
        (1, "1F0", 1.5, 2.0),
    ]
    assert len(viz.load_chrome_trace(tmp_path / "run.json")) == 5  # all steps, no waits
    lines = viz.render_text_timeline(events, width=5).splitlines()
    assert lines[1:] == ["0 |F..BB|", "1 |.FB..|"]


def test_malformed_trace_names_the_event(tmp_path):
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
        viz.events_from_chrome_trace(bad, "t.json")
    with pytest.raises(InputError, match="traceEvents"):
        viz.events_from_chrome_trace({"events": []}, "t.json")


# --- terminal ------------------------------------------------------------------------------


def test_text_timeline_marks_kinds_chunks_and_idle():
    events = [
        Event(0, Action(0, "F", 0), 0.0, 1.0),
        Event(0, Action(0, "B", 0), 2.0, 4.0),
        Event(1, Action(1, "F", 0), 1.0, 2.0),
        Event(1, Action(2, "F", 0), 2.0, 3.0),  # device 1's second stage: a later chunk
    ]
    lines = viz.render_text_timeline(events, width=4).splitlines()
    assert lines[1:] == ["0 |F.BB|", "1 |.Ff.|"]
    assert "bubble 37.5%" in lines[0]


def test_text_timeline_width_matches_request(cases):
    *_, result = cases["interleaved"]
    lines = viz.render_text_timeline(result, width=60).splitlines()
    assert len(lines) == 1 + 4
    assert all(len(line) == len("0 |") + 60 + 1 for line in lines[1:])
    idle = sum(line.count(".") for line in lines[1:]) / (4 * 60)
    assert idle == pytest.approx(result.bubble_ratio, abs=0.05)
