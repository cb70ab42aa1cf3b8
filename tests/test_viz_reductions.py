"""Tests of the timelines' data-parallel rows: one thin all-reduce row under each device that
runs reductions, in the PNG/SVG, the HTML and the text timeline; none without them."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET

import matplotlib.colors as mcolors
import pytest

from octopipe import api, viz
from octopipe.profile import DataParallel
from octopipe.sim import Simulator
from octopipe.units import time_unit
from octopipe.viz import timeline
from octopipe.viz.layout import REDUCE_ROW
from tests.test_viz import png_size
from tests.viz_samples import data_parallel, layer_profile, one_f_one_b, v_shape_greedy

DP = DataParallel(degree=4, bandwidth=50e9, latency=1e-5)


@pytest.fixture(scope="module")
def llama():
    """1F1B on two devices of llama3-8b, with four replicas and without: (with, without)."""
    plain = api.profile_from_config("llama3-8b", devices=2)
    replicated = plain.model_copy(update={"data_parallel": DP})
    plan = api.baseline(replicated, "1f1b", "uniform", num_microbatches=4)
    with_dp = Simulator(replicated).run(plan, detail=True)
    without = Simulator(plain).run(plan, detail=True)
    assert len(with_dp.reductions) == 2 and not without.reductions
    return with_dp, without


@pytest.fixture(scope="module")
def vshape():
    """A V on four devices, two stages (so two all-reduces) per device."""
    profile = data_parallel(layer_profile(8, 4))
    result = Simulator(profile).run(v_shape_greedy(profile, 4, 8))
    assert len(result.reductions) == 8
    return result


@pytest.fixture(scope="module")
def partial():
    """Only layers 0 and 1 (stages 0 and 1, on devices 0 and 1) have gradients to reduce."""
    profile = data_parallel(layer_profile(4, 4), grad_layers={0, 1})
    result = Simulator(profile).run(one_f_one_b(4, 8))
    assert sorted(r.device for r in result.reductions) == [0, 1]
    return result


def drawn_figure(result, path, monkeypatch):
    """Draw `result` and keep the figure open to inspect it."""
    kept = []
    monkeypatch.setattr(timeline.plt, "close", kept.append)
    viz.save_timeline(result, path)
    monkeypatch.undo()
    return kept[0]


def reduce_bar_rows(fig) -> list[float]:
    """The vertical centre of every all-reduce box drawn, over every band."""
    purple = mcolors.to_rgba(viz.REDUCE_COLOR)
    return [
        float(path.vertices[:4, 1].mean())
        for ax in fig.axes
        for c in ax.collections
        if len(c.get_facecolors()) and tuple(c.get_facecolors()[0]) == pytest.approx(purple)
        for path in c.get_paths()
    ]


def reduce_bars(fig) -> int:
    return len(reduce_bar_rows(fig))


def row_labels(fig, minor: bool) -> list[str]:
    return [t.get_text() for t in fig.axes[0].get_yticklabels(minor=minor)]


def legend_texts(fig) -> list[str]:
    return [t.get_text() for t in fig.legends[0].get_texts()]


# --- rows ----------------------------------------------------------------------------------


def test_rows_put_a_thin_row_under_devices_with_reductions():
    rows = viz.timeline_rows(3, {1})
    assert rows.compute == (0.5, 1.5, 3.0)
    assert rows.reduce == {1: 2.0 + REDUCE_ROW / 2}
    assert rows.height == 3 + REDUCE_ROW
    assert viz.timeline_rows(3).compute == (0.5, 1.5, 2.5) and not viz.timeline_rows(3).reduce


def test_reduction_rows_make_the_axes_taller(llama):
    with_dp, _ = llama
    events = viz.events_of(with_dp)
    plain = viz.timeline_layout(events, with_dp.iteration_time, 2)
    reduced = viz.timeline_layout(events, with_dp.iteration_time, 2, [0, 1])
    assert plain.axes_height == pytest.approx(2 * plain.row_height)
    assert reduced.axes_height == pytest.approx((2 + 2 * REDUCE_ROW) * reduced.row_height)
    assert reduced.figure_size[1] > plain.figure_size[1]


# --- PNG / SVG ------------------------------------------------------------------------------


def test_png_draws_an_all_reduce_row_per_device(llama, tmp_path, monkeypatch):
    with_dp, _ = llama
    fig = drawn_figure(with_dp, tmp_path / "dp.png", monkeypatch)
    assert row_labels(fig, minor=True) == ["device 0 all-reduce", "device 1 all-reduce"]
    assert [t.split("\n")[0] for t in row_labels(fig, minor=False)] == ["device 0", "device 1"]
    assert reduce_bars(fig) == 2
    stage_texts = sorted(t.get_text() for t in fig.axes[0].texts if t.get_text().startswith("s"))
    assert stage_texts == ["s0", "s1"]  # room for both labels
    assert "gradient all-reduce" in legend_texts(fig)
    timeline.plt.close(fig)


def test_png_bars_sit_on_their_devices_row(vshape, tmp_path, monkeypatch):
    fig = drawn_figure(vshape, tmp_path / "v.png", monkeypatch)
    rows = viz.timeline_rows(4, range(4))
    expected = [rows.reduce[r.device] for r in viz.reductions_of(vshape)]
    assert reduce_bar_rows(fig) == pytest.approx(expected)  # two per device, in device order
    ax = fig.axes[0]
    assert list(ax.get_yticks(minor=True)) == pytest.approx(list(rows.reduce.values()))
    assert ax.get_ylim() == pytest.approx((rows.height, 0.0))
    timeline.plt.close(fig)


def test_devices_without_reductions_get_no_row(partial, tmp_path, monkeypatch):
    fig = drawn_figure(partial, tmp_path / "p.png", monkeypatch)
    assert row_labels(fig, minor=True) == ["device 0 all-reduce", "device 1 all-reduce"]
    assert reduce_bars(fig) == 2
    timeline.plt.close(fig)


def test_without_data_parallelism_the_picture_is_unchanged(llama, tmp_path, monkeypatch):
    with_dp, without = llama
    fig = drawn_figure(without, tmp_path / "plain.png", monkeypatch)
    assert row_labels(fig, minor=True) == [] and reduce_bars(fig) == 0
    assert "gradient all-reduce" not in legend_texts(fig)
    timeline.plt.close(fig)
    events = viz.events_of(without)
    layout = viz.timeline_layout(events, without.iteration_time, 2)
    assert png_size(tmp_path / "plain.png") == layout.pixels
    assert layout.axes_height == pytest.approx(2 * layout.row_height)
    # Bare events carry no reductions: the DP run's events draw as a plain run would.
    bare = viz.save_timeline(list(with_dp.events), tmp_path / "bare.png")
    span = max(e.end for e in with_dp.events)
    assert png_size(bare) == viz.timeline_layout(with_dp.events, span, 2).pixels


def test_svg_has_one_element_per_reduction(vshape, tmp_path):
    path = viz.save_timeline(vshape, tmp_path / "v.svg")
    ids = [el.get("id") for el in ET.parse(path).getroot().iter()]
    reduce_ids = sorted(i for i in ids if (i or "").startswith("reduce-"))
    assert reduce_ids == sorted(f"reduce-d{r.device}-s{r.stage}" for r in vshape.reductions)


# --- HTML ----------------------------------------------------------------------------------


def reduce_rects(page: str) -> dict[str, tuple[float, float]]:
    """id -> (x, width) of every all-reduce rectangle."""
    found = re.findall(r'<rect id="(reduce-[^"]+)"[^>]* x="([^"]+)"[^>]* width="([^"]+)"', page)
    return {i: (float(x), float(w)) for i, x, w in found}


def test_html_has_a_rect_per_reduction_in_time(llama):
    with_dp, _ = llama
    page = viz.html_timeline(with_dp)
    _, scale = time_unit(with_dp.iteration_time)
    rects = reduce_rects(page)
    assert len(rects) == len(with_dp.reductions)
    for r in with_dp.reductions:
        x, w = rects[f"reduce-d{r.device}-s{r.stage}"]
        assert x == pytest.approx(r.start * scale, rel=1e-6)
        assert x + w == pytest.approx(r.end * scale, rel=1e-6)
    assert re.findall(r'class="lab ar-lab"[^>]*>([^<]+)<', page) == [
        "device 0 all-reduce",
        "device 1 all-reduce",
    ]
    assert f' {2 + 2 * REDUCE_ROW:g}" preserveAspectRatio' in page  # the viewBox's height
    assert "gradient all-reduce</span>" in page and "2 gradient all-reduces" in page


def test_html_only_devices_with_reductions_get_a_row(partial):
    page = viz.html_timeline(partial)
    assert {i for i in reduce_rects(page)} == {"reduce-d0-s0", "reduce-d1-s1"}
    assert page.count('class="lab ar-lab"') == 2


def test_html_without_data_parallelism_has_no_reduce_rows(llama):
    _, without = llama
    page = viz.html_timeline(without)
    assert not reduce_rects(page) and 'ar-lab"' not in page
    assert re.search(r'viewBox="0 0 [^ ]+ 2"', page)
    assert "gradient all-reduce</span>" not in page


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the page's script")
def test_html_hover_names_the_stage_and_times(llama, tmp_path):
    """Run the page's script with stub elements and hover a reduction, then an action."""
    with_dp, _ = llama
    page = viz.html_timeline(with_dp)
    script = page.split("<script>")[1].split("</script>")[0]
    r = with_dp.reductions[0]
    harness = _HOVER_HARNESS % (json.dumps(script), json.dumps(page))
    (tmp_path / "hover.js").write_text(harness)
    done = subprocess.run(
        ["node", str(tmp_path / "hover.js"), f"reduce-d{r.device}-s{r.stage}", "action-d0-0F0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    reduce_tip, action_tip = done.stdout.split("\n--\n")[:2]
    unit, scale = time_unit(with_dp.iteration_time)
    assert f"all-reduce of stage {r.stage}'s gradients" in reduce_tip
    assert f"device {r.device}" in reduce_tip
    for word, value in (("start", r.start), ("end", r.end), ("takes", r.end - r.start)):
        shown = re.search(rf"{word} ([0-9.e+-]+) {unit}", reduce_tip).group(1)
        assert float(shown) == pytest.approx(value * scale, rel=1e-5)
    assert "forward, stage 0, microbatch 0" in action_tip


_HOVER_HARNESS = """
const script = %s, page = %s, on = {}, els = {};
function el() {
  return {style: {}, clientWidth: 1000, scrollLeft: 0, addEventListener(t, f) { on[t] = f; },
    getBoundingClientRect() { return {left: 0, top: 0, width: 1000}; },
    querySelectorAll() { return []; }, setAttribute() {}, classList: {toggle() {}}};
}
global.document = {getElementById(id) { return els[id] ||= el(); }, addEventListener() {},
  querySelectorAll() { return []; }};
global.window = {innerWidth: 1600, innerHeight: 900, scrollY: 0,
  addEventListener(t, f) { on[t] = f; }};
global.requestAnimationFrame = (f) => f();
eval(script);
for (const id of process.argv.slice(2)) {
  const m = new RegExp('<rect id="' + id + '"[^>]* x="([^"]+)"[^>]* width="([^"]+)"').exec(page);
  const target = {tagName: "rect", id, getAttribute(a) { return a === "x" ? m[1] : m[2]; }};
  on.mousemove({target, clientX: 10, clientY: 10});
  console.log(els.tip.textContent + "\\n--");
}
"""


# --- text ----------------------------------------------------------------------------------


def test_text_timeline_puts_reductions_under_their_device(llama):
    with_dp, without = llama
    lines = viz.render_text_timeline(with_dp, width=50).splitlines()
    assert [line[:3] for line in lines[1:]] == ["0 |", "  |", "1 |", "  |"]
    step = with_dp.iteration_time / 50
    for line, r in zip(lines[2::2], with_dp.reductions):
        # 'R' in the columns whose middle lies in the reduction.
        cells = "".join("R" if r.start <= (c + 0.5) * step < r.end else " " for c in range(50))
        assert line == f"  |{cells}|"
    assert len(viz.render_text_timeline(without, width=50).splitlines()) == 1 + 2


def test_text_timeline_marks_later_chunks_lower_case(vshape, partial):
    lines = viz.render_text_timeline(vshape, width=80).splitlines()
    assert len(lines) == 1 + 4 + 4
    assert all({"R", "r"} <= set(lines[i]) for i in (2, 4, 6, 8))
    assert len(viz.render_text_timeline(partial, width=40).splitlines()) == 1 + 4 + 2
