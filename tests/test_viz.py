"""Tests of octopipe.viz: timeline pictures, the HTML timeline, memory plots, text timelines."""

from __future__ import annotations

import re
import struct
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from octopipe import viz
from octopipe.actions import Action, Event
from octopipe.errors import InputError
from octopipe.sim import Simulator
from octopipe.sim.memory import memory_over_time
from octopipe.units import time_unit
from octopipe.viz.layout import MAX_WIDTH_PX
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
    assert time_unit(2.5) == ("s", 1.0)
    assert time_unit(0.0595) == ("ms", 1e3)
    assert time_unit(2e-4) == ("µs", 1e6)


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
    norm = viz.events_of(events)
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
    assert h1 > h0
    assert w2 * h2 > 2 * w0 * h0  # more room for 8 times the actions: wider, or in bands
    assert png_size(tmp_path / "long.png")[0] <= MAX_WIDTH_PX


def bounded(width: int, height: int) -> bool:
    """Fits a screen (within the timeline's bounds) and is not flatter than about 4:1."""
    from octopipe.viz.layout import MAX_HEIGHT_PX, MAX_WIDTH_PX

    return width <= MAX_WIDTH_PX and height <= MAX_HEIGHT_PX and width <= 4.5 * height


@pytest.mark.parametrize("split", [False, True])
def test_32_devices_by_128_microbatches_fit_a_screen(split):
    """Layout only: the picture is screen-sized whatever the plan, rows stay readable, and
    labels appear only on boxes wide enough for them."""
    result = Simulator(layer_profile(32, 32)).run(one_f_one_b(32, 128, split=split))
    events = viz.events_of(result)
    layout = viz.timeline_layout(events, result.iteration_time, result.num_devices)
    assert bounded(*layout.pixels)
    assert layout.row_height >= 0.3  # inches per row
    for e in events:
        size = layout.label_size(e)
        text = str(e.action.mb)
        assert size is None or layout.box_width_pt(e.end - e.start) >= len(text) * size * 0.62


def test_a_large_plan_draws_within_bounds(tmp_path):
    """32 devices: a PNG within the bounds (and as the layout said), and a measured-style run
    (clock times) alike, drawn box by box when asked (by default a plan this size, its
    boxes under 5 pixels, gets the overview: tests/test_viz_scale.py)."""
    from octopipe.baselines import make_baseline

    profile = layer_profile(64, 32)
    plan = make_baseline(profile, "zbv", "uniform", 32, 64)
    result = Simulator(profile).run(plan)
    path = viz.save_timeline(result, tmp_path / "zbv.png", title="zbv", overview=False)
    width, height = png_size(path)
    assert bounded(width, height)
    layout = viz.timeline_layout(viz.events_of(result), result.iteration_time, 32)
    assert (width, height) == layout.pixels
    shifted = [Event(e.device, e.action, e.start + 7.0, e.end + 7.0) for e in result.events]
    measured = viz.save_timeline(shifted, tmp_path / "measured.png", overview=False)
    assert bounded(*png_size(measured))
    assert bounded(*png_size(viz.save_timeline(result, tmp_path / "overview.png")))


def test_few_devices_long_run_wraps_into_bands_not_a_strip():
    result = Simulator(layer_profile(2, 2)).run(one_f_one_b(2, 256))
    layout = viz.timeline_layout(viz.events_of(result), result.iteration_time, 2)
    assert layout.bands > 1 and bounded(*layout.pixels)


def test_zero_length_actions_do_not_shrink_the_others():
    """A first stage with no input gradient has I of length 0: the layout ignores them."""
    events = [Event(0, Action(0, "F", m), 2.0 * m, 2.0 * m + 1.0) for m in range(40)]
    events += [Event(0, Action(0, "I", m), 80.0 + m, 80.0 + m) for m in range(40)]
    layout = viz.timeline_layout(events, 120.0, 1)
    assert all(layout.label_size(e) is not None for e in events[:40])
    assert layout.axes_width * layout.bands > 8.0  # more than the smallest: scaled to F boxes


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
        viz.events_of(result)


# --- HTML timeline -----------------------------------------------------------------------


def html_action_ids(text: str) -> list[str]:
    return re.findall(r'<rect id="(action-[^"]+)"', text)


@pytest.mark.parametrize("name", ["split", "vshape"])
def test_html_timeline_has_one_element_per_action(cases, tmp_path, name):
    *_, result = cases[name]
    page = viz.save_html_timeline(result, tmp_path / "t.html", title="a <b> & c").read_text()
    expected = [f"action-d{e.device}-{e.action}" for e in result.events]
    assert sorted(html_action_ids(page)) == sorted(expected)
    assert "a &lt;b&gt; &amp; c" in page and "<script>" in page
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in page  # offline: nothing to fetch


def test_html_timeline_places_actions_in_time(cases):
    *_, result = cases["1f1b"]
    page = viz.html_timeline(result)
    unit, scale = time_unit(result.iteration_time)
    e = max(result.events, key=lambda e: e.end)
    rect = re.search(rf'<rect id="action-d{e.device}-{e.action}"[^>]*>', page).group(0)
    x = float(re.search(r' x="([^"]+)"', rect).group(1))
    w = float(re.search(r' width="([^"]+)"', rect).group(1))
    assert x == pytest.approx(e.start * scale, rel=1e-6)
    assert x + w == pytest.approx(e.end * scale, rel=1e-6)
    assert f'viewBox="0 0 {result.iteration_time * scale:.7g} 4"' in page


def test_text_and_html_timelines_do_not_import_matplotlib():
    import subprocess
    import sys

    code = (
        "import sys, octopipe.viz.text, octopipe.viz.html, octopipe.trace, octopipe.viz;"
        "sys.exit('matplotlib' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# --- memory --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["1f1b", "split", "interleaved", "vshape"])
def test_memory_curve_peaks_at_the_simulated_peak(cases, name):
    profile, plan, result = cases[name]
    traces = memory_over_time(result, plan, profile)
    assert [t.peak_bytes for t in traces] == pytest.approx(result.peak_memory_bytes)
    for t in traces:
        assert t.bytes[-1] == t.static_bytes == min(t.bytes)  # all activations freed at the end
        assert list(t.times) == sorted(set(t.times))  # one step per instant


def test_memory_plot_writes_png_and_svg(cases, tmp_path):
    profile, plan, result = cases["vshape"]
    width, height = png_size(viz.save_memory_plot(result, plan, profile, tmp_path / "m.png"))
    assert width > 800 and height > 400
    ET.parse(viz.save_memory_plot(result, plan, profile, tmp_path / "m.svg"))


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
