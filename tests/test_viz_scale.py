"""Pictures at any scale: past a screen's width of actions or devices the timeline becomes an
overview (utilization bars, a bubble heat map, one period zoomed in); rows name their kind of
GPU on a mixed cluster; the critical path never blackens a row; the memory plot draws every
device's capacity; a measured step can sit above its prediction on one time axis."""

from __future__ import annotations

import random
import xml.etree.ElementTree as ET

import matplotlib.colors
import numpy as np
import pytest

from octopipe import viz
from octopipe.actions import Action, Event
from octopipe.baselines import make_baseline
from octopipe.layouts.cluster import Cluster, parse_gpus
from octopipe.profile import Device
from octopipe.sim import Simulator
from octopipe.viz.compare import save_measured_and_predicted
from octopipe.viz.layout import MAX_HEIGHT_PX, MAX_WIDTH_PX, needs_overview
from octopipe.viz.overview import idle_shares, steady_window
from tests.test_viz import png_size
from tests.viz_samples import layer_profile


def _svg_texts(path) -> str:
    return path.read_text()  # matplotlib keeps each text as a comment beside its glyphs


def _action_ids(path) -> list[str]:
    root = ET.parse(path).getroot()
    return [el.get("id") for el in root.iter() if (el.get("id") or "").startswith("action-")]


@pytest.fixture(scope="module")
def big():
    """64 devices, 128 microbatches, two chunks each: 32,768 actions, a barcode as boxes."""
    profile = layer_profile(128, 64)
    return profile, Simulator(profile).run(make_baseline(profile, "i1f1b", "uniform", 64, 128))


def test_a_plan_past_a_screen_of_actions_draws_an_overview(big, tmp_path):
    _, result = big
    events = viz.events_of(result)
    assert needs_overview(viz.timeline_layout(events, result.iteration_time, 64), events)
    png = viz.save_timeline(result, tmp_path / "big.png", title="64 devices")
    width, height = png_size(png)
    assert width <= MAX_WIDTH_PX and height <= MAX_HEIGHT_PX
    svg = viz.save_timeline(result, tmp_path / "big.svg")
    text = _svg_texts(svg)
    assert "an overview (every action: the HTML timeline)" in text
    assert "idle share of each slice" in text and "utilization" in text
    assert "one period of the steady state" in text
    assert "(F blue, B red; lighter: later chunks)" in text  # the kinds drawn, and no others
    # The zoomed window draws its actions one by one; the rest are in the heat map.
    assert 0 < len(_action_ids(svg)) < len(events) / 20


def test_a_small_plan_is_still_a_timeline(tmp_path):
    profile = layer_profile(8, 4)
    result = Simulator(profile).run(make_baseline(profile, "1f1b", "uniform", 4, 8))
    events = viz.events_of(result)
    assert not needs_overview(viz.timeline_layout(events, result.iteration_time, 4), events)
    svg = viz.save_timeline(result, tmp_path / "small.svg")
    assert len(_action_ids(svg)) == len(events)
    assert "overview" not in _svg_texts(svg)
    forced = viz.save_timeline(result, tmp_path / "forced.svg", overview=True)
    assert "an overview" in _svg_texts(forced)


def test_idle_shares_are_each_slices_idle_time():
    rng = random.Random(3)
    events, t = [], [0.0, 0.0, 0.0]
    for i in range(300):
        d = rng.randrange(3)
        start = t[d] + rng.random() * 0.3
        end = start + rng.random() * 2.0
        events.append(Event(d, Action(0, "F", i), start, end))
        t[d] = end
    span, bins = max(t), 37
    got = idle_shares(events, 3, span, bins)
    edges = np.linspace(0, span, bins + 1)
    want = np.ones((3, bins))
    for e in events:
        overlap = np.clip(np.minimum(edges[1:], e.end) - np.maximum(edges[:-1], e.start), 0, None)
        want[e.device] -= overlap / (span / bins)
    assert np.allclose(got, np.clip(want, 0, 1), atol=1e-9)


def test_the_zoomed_window_is_one_steady_period(big):
    _, result = big
    events = viz.events_of(result)
    lo, hi = steady_window(events, result.iteration_time)
    assert 0 <= lo < result.iteration_time / 2 < hi <= result.iteration_time
    # i1f1b with two chunks: a stage's forwards are two chunks' F and B apart in steady state.
    f = b = w = 1e-3  # layer_profile's times, two layers a stage
    assert hi - lo == pytest.approx(max(2 * 2 * (f + b + w), 6 * 2 * f), rel=0.05)


def test_rows_name_their_kind_of_gpu_on_a_mixed_cluster(tmp_path):
    topology = Cluster(parse_gpus("2xh100,2xa100"), 2).replica_topology(1, 4, 1)
    assert [d.name for d in topology.devices] == ["h100", "h100", "a100", "a100"]
    profile = layer_profile(8, 4).with_devices(topology.devices)
    names = viz.style.gpu_names(profile)
    assert names == ("h100", "h100", "a100", "a100")
    assert viz.style.gpu_names(layer_profile(8, 4)) is None  # one kind: rows need none
    result = Simulator(profile).run(make_baseline(profile, "1f1b", "uniform", 4, 8))
    svg = viz.save_timeline(result, tmp_path / "mixed.svg", device_names=names)
    assert "device 3 · a100" in _svg_texts(svg)
    page = viz.html_timeline(result, device_names=names)
    assert "device 0 · h100" in page and "device 3 · a100" in page
    over = viz.save_timeline(
        result, tmp_path / "mixed-overview.svg", device_names=names, overview=True
    )
    assert "device 2 · a100" in _svg_texts(over)


def test_the_critical_path_never_blackens_a_row(tmp_path, monkeypatch):
    """Critical boxes are outlined only where they are wide enough to show the outline
    inside; narrower ones get a strip at their foot (outlines on them merge into a black
    row). Both kinds are there in this picture, and every outline is on a wide box."""
    import octopipe.viz.timeline as timeline
    from octopipe.viz.style import CRITICAL_EDGE

    profile = layer_profile(4, 2, head_scale=8.0)  # the last stage binds: its row is critical
    result = Simulator(profile).run(make_baseline(profile, "1f1b", "uniform", 2, 1600))
    figures = []
    monkeypatch.setattr(timeline.plt, "close", figures.append)
    viz.save_timeline(result, tmp_path / "critical.png", overview=False)
    outlines, strips = [], []
    for ax in figures[0].axes:
        points_per_second = ax.get_window_extent().width / (ax.get_xlim()[1] - ax.get_xlim()[0])
        points_per_second *= 72 / figures[0].dpi
        for c in ax.collections:
            edge = matplotlib.colors.to_hex(c.get_edgecolor()[0]) if len(c.get_edgecolor()) else ""
            face = matplotlib.colors.to_hex(c.get_facecolor()[0]) if len(c.get_facecolor()) else ""
            widths = [np.ptp(p.vertices[:, 0]) * points_per_second for p in c.get_paths()]
            if edge == CRITICAL_EDGE.lower() and not len(c.get_facecolor()):
                outlines += widths
            elif face == CRITICAL_EDGE.lower():
                strips += widths
    assert outlines and strips
    assert min(outlines) > 4 >= max(strips)


def test_the_memory_plot_draws_every_capacity(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    from octopipe.viz.memory import CAPACITY_COLOR

    profile = layer_profile(8, 4, memory_bytes=float(400 << 30))  # far above any peak
    plan = make_baseline(profile, "1f1b", "uniform", 4, 8)
    result = Simulator(profile).run(plan)
    drawn = []
    original = Axes.axhline
    monkeypatch.setattr(
        Axes, "axhline", lambda self, y=0, **kw: drawn.append((y, kw)) or original(self, y, **kw)
    )
    viz.save_memory_plot(result, plan, profile, tmp_path / "memory.png")
    capacities = [y for y, kw in drawn if kw.get("color") == CAPACITY_COLOR]
    assert len(capacities) == 4 and len(set(capacities)) == 1


def test_a_measured_step_sits_above_its_prediction_on_one_axis(tmp_path, monkeypatch):
    import octopipe.viz.compare as compare

    profile = layer_profile(8, 2)
    plan = make_baseline(profile, "1f1b", "uniform", 2, 4)
    predicted = Simulator(profile).run(plan)
    # "Measured": every action 30% slower, on a clock of its own.
    measured = [
        Event(e.device, e.action, 5 + 1.3 * e.start, 5 + 1.3 * e.end) for e in predicted.events
    ]
    figures = []
    monkeypatch.setattr(compare.plt, "close", figures.append)
    svg = save_measured_and_predicted(measured, predicted, tmp_path / "both.svg", "run")
    ids = _action_ids(svg)
    assert len(ids) == 2 * len(predicted.events) and len(set(ids)) == len(predicted.events)
    text = _svg_texts(svg)
    assert "measured: iteration" in text and "predicted: iteration" in text
    top, bottom = figures[0].axes
    assert top.get_xlim() == bottom.get_xlim()  # one time axis, from 0 ...
    unit_scale = viz.style.time_unit(1.3 * predicted.iteration_time)[1]
    assert top.get_xlim() == pytest.approx((0, 1.3 * predicted.iteration_time * unit_scale))
    assert top.get_title(loc="left").startswith("measured")  # ... the measured step on top
    (legend,) = figures[0].legends  # what both panels draw: 1F1B's kinds, the critical path
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == ["F forward", "B backward", "idle", "critical path"]


def test_a_chunk_in_the_legend_shows_the_kinds_it_lightens(tmp_path, monkeypatch):
    """Interleaved: the legend's chunk swatches are the kinds' shades, as the boxes are."""
    profile = layer_profile(8, 2)
    result = Simulator(profile).run(make_baseline(profile, "i1f1b", "uniform", 2, 4))
    figures = []
    monkeypatch.setattr(viz.timeline.plt, "close", figures.append)
    viz.save_timeline(result, tmp_path / "i.png")
    (legend,) = figures[0].legends
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == ["F forward", "B backward", "chunk 0", "chunk 1", "idle", "critical path"]
    from octopipe.viz.boxes import kind_colors, legend_entries

    handles, labels, _ = legend_entries(viz.events_of(result), 2, critical=True)
    for chunk in (0, 1):  # each swatch is a box's colour: F's and B's shade of that chunk
        swatch = handles[labels.index(f"chunk {chunk}")]
        got = [tuple(p.get_facecolor()[:3]) for p in swatch]
        assert got == [pytest.approx(kind_colors(2)[(k, chunk)]) for k in "FB"]


def test_devices_carry_no_name_unless_given():
    assert "name" not in layer_profile(2, 2).to_dict()["devices"][0]
    named = layer_profile(2, 2).with_devices([Device(name="h100"), Device(name="a100")])
    assert [d["name"] for d in named.to_dict()["devices"]] == ["h100", "a100"]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_run_png_sets_the_measured_step_above_the_prediction(tmp_path):
    from octopipe.cli import main

    profile, plan, svg = tmp_path / "p.json", tmp_path / "plan.json", tmp_path / "run.svg"
    argv = ["profile-arch", "tiny-llama", "--devices", "2", "--seq-len", "8", "-o", str(profile)]
    assert main(argv) == 0
    argv = ["baseline", "--profile", str(profile), "--schedule", "1f1b", "--partition", "uniform"]
    assert main([*argv, "--microbatches", "2", "-o", str(plan)]) == 0
    argv = ["run", "--plan", str(plan), "--model", "tiny-llama", "--steps", "2"]
    assert main([*argv, "--png", str(svg), "--profile", str(profile)]) == 0
    ids = _action_ids(svg)
    assert len(ids) == 2 * 8 and len(set(ids)) == 8  # 2 devices x 2 microbatches x F, B
    text = _svg_texts(svg)
    assert "measured: iteration" in text and "predicted: iteration" in text


def test_the_overview_names_only_the_colours_it_draws():
    from octopipe.actions import Action, Event
    from octopipe.viz.overview import _colors_drawn

    split = [Event(0, Action(0, k, 0), t, t + 1.0) for t, k in enumerate("FIW")]
    assert _colors_drawn(split, {0: 0}) == "F blue, I orange, W green"
    two = [*split, Event(0, Action(2, "F", 0), 4.0, 5.0)]
    assert _colors_drawn(two, {0: 0, 2: 1}) == "F blue, I orange, W green; lighter: later chunks"
