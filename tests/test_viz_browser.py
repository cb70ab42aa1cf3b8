"""The HTML timeline in a real browser: headless Chromium (Debian's `chromium`; the test is
skipped where it is not installed) loads the page offline, runs its script and renders it,
with no console message at all, the rows grown to fill the window and the boxes labelled."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess

import pytest

from octopipe import viz
from octopipe.baselines import make_baseline
from octopipe.sim import Simulator
from tests.test_viz import png_size
from tests.viz_samples import layer_profile

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium package")

WINDOW = (1400, 900)
# As the machine's notes advise: no sandbox as root, no network, a profile of its own.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    f"--window-size={WINDOW[0]},{WINDOW[1]}",
    "--virtual-time-budget=5000",
    "--enable-logging=stderr",
    "--v=0",
]


def _chromium(page, tmp_path, *extra: str) -> subprocess.CompletedProcess:
    argv = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *extra, page.as_uri()]
    child = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = child.communicate(timeout=120)
    finally:  # the browser's helper processes go with it
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    return subprocess.CompletedProcess(argv, child.returncode, out, err)


def _console(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


@pytest.mark.parametrize(("devices", "microbatches"), [(2, 4), (4, 8), (64, 128)])
def test_chromium_renders_the_page_without_a_console_message(tmp_path, devices, microbatches):
    profile = layer_profile(2 * devices, devices)
    result = Simulator(profile).run(
        make_baseline(profile, "i1f1b", "uniform", devices, microbatches)
    )
    page = viz.save_html_timeline(result, tmp_path / "timeline.html", title="browser")
    done = _chromium(page, tmp_path, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    assert _console(done.stderr) == []
    dom = done.stdout
    # The script ran: the rows fill the window at every size (a few tall rows; 64 rows of a
    # few pixels, the whole plan in view), the time axis has ticks, and boxes wide enough
    # carry their microbatch (at 64 devices none is, unzoomed).
    height = float(re.search(r'<svg id="tl"[^>]* height="([0-9.]+)"', dom).group(1))
    assert 0.6 * WINDOW[1] <= height <= WINDOW[1]
    assert dom.count('class="tick"') >= 3
    # Thin rows keep the critical path's outlines off (they would paint them black).
    dense = re.search(r'<svg id="tl"[^>]* class="dense"', dom) is not None
    assert dense == (devices >= 64)
    labels = re.findall(r"<text [^>]*>([0-9]+)</text>", dom)
    assert all(int(mb) < microbatches for mb in labels)
    assert bool(labels) == (devices <= 8)


def test_chromium_draws_the_page(tmp_path):
    profile = layer_profile(8, 4)
    result = Simulator(profile).run(make_baseline(profile, "1f1b", "uniform", 4, 8))
    page = viz.save_html_timeline(result, tmp_path / "timeline.html")
    shot = tmp_path / "shot.png"
    done = _chromium(page, tmp_path, f"--screenshot={shot}")
    assert done.returncode == 0 and _console(done.stderr) == []
    assert png_size(shot) == WINDOW
