"""The size of a timeline picture, fixed before anything is drawn (no plotting library).

The picture fits a screen: at most `MAX_WIDTH_PX` wide and `MAX_HEIGHT_PX` tall. A long
iteration wraps into bands (the time axis continues in the next band below) while the figure
stays within both bounds, rows grow so the figure is never flatter than about 4:1, and a
microbatch label is drawn only where `label_size` says it fits. A device with data-parallel
all-reduces gets a thin row just below its own (`timeline_rows`).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from octopipe.actions import Event
from octopipe.viz.style import label_font_size

MAX_WIDTH_PX = 2400
MAX_HEIGHT_PX = 1800
# Fixed margins around the bands, in inches; the top holds two lines of title and a legend.
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 1.5, 0.8, 1.0, 0.6
BAND_GAP = 0.55  # between bands: room for the upper band's tick labels
_ROW_HEIGHT, _MIN_ROW, _MAX_ROW = 0.34, 0.12, 1.0
BAR_FILL = 0.82  # share of a row's height a box fills
_TYPICAL_BOX = 0.2  # inches for a short action (first quartile), room for a 3-digit label
_MIN_AXES_WIDTH = 8.0
_FLATTEST = 4.0  # width over height at most (about)
INCHES_PER_TICK = 1.3
REDUCE_ROW = 0.5  # an all-reduce row's height, as a share of a device's row
# Past these the timeline is a barcode, and the picture is an overview instead (`overview.py`):
# a typical action narrower than this many pixels (about a screen's width of actions a row),
MIN_BOX_PX = 5.0
# or more devices than rows a screen shows apart.
MAX_TIMELINE_DEVICES = 96


@dataclass(frozen=True)
class TimelineRows:
    """Where the rows sit, in device rows from the top: device d's row is centred at
    `compute[d]`; a device with all-reduces has a thin row just below, centred at `reduce[d]`."""

    compute: tuple[float, ...]
    reduce: dict[int, float]

    @property
    def height(self) -> float:
        return len(self.compute) + REDUCE_ROW * len(self.reduce)


def timeline_rows(num_devices: int, reduce_devices: Collection[int] = ()) -> TimelineRows:
    compute, reduce = [], {}
    top = 0.0
    for d in range(num_devices):
        compute.append(top + 0.5)
        top += 1.0
        if d in reduce_devices:
            reduce[d] = top + REDUCE_ROW / 2
            top += REDUCE_ROW
    return TimelineRows(tuple(compute), reduce)


@dataclass(frozen=True)
class TimelineLayout:
    """Sizes of a timeline picture, in inches and points, fixed before anything is drawn."""

    axes_width: float  # inches, of each band
    row_height: float  # inches
    num_devices: int
    bands: int
    span: float  # seconds of the whole iteration
    dpi: int
    reduce_devices: tuple[int, ...] = ()  # devices with an all-reduce row

    @property
    def rows(self) -> TimelineRows:
        return timeline_rows(self.num_devices, self.reduce_devices)

    @property
    def axes_height(self) -> float:
        return self.row_height * self.rows.height

    @property
    def band_span(self) -> float:
        return self.span / self.bands

    @property
    def figure_size(self) -> tuple[float, float]:
        return (
            self.axes_width + MARGIN_LEFT + MARGIN_RIGHT,
            _figure_height(self.axes_height, self.bands),
        )

    @property
    def pixels(self) -> tuple[int, int]:
        w, h = self.figure_size
        return round(w * self.dpi), round(h * self.dpi)

    @property
    def bar_height_pt(self) -> float:
        return BAR_FILL * self.row_height * 72.0

    @property
    def reduce_bar_height_pt(self) -> float:
        return REDUCE_ROW * self.bar_height_pt

    def box_width_pt(self, seconds: float) -> float:
        return seconds / self.band_span * self.axes_width * 72.0 if self.span > 0 else 0.0

    def box_width_px(self, seconds: float) -> float:
        return self.box_width_pt(seconds) / 72.0 * self.dpi

    def label_size(self, event: Event) -> float | None:
        """Font size of the event's microbatch label, None where it does not fit."""
        return label_font_size(
            self.box_width_pt(event.end - event.start), self.bar_height_pt, str(event.action.mb)
        )


def _figure_height(axes_height: float, bands: int) -> float:
    return bands * axes_height + (bands - 1) * BAND_GAP + MARGIN_TOP + MARGIN_BOTTOM


def timeline_layout(
    events: Sequence[Event], span: float, num_devices: int, reduce_devices: Sequence[int] = ()
) -> TimelineLayout:
    """The width that gives a short action (the first quartile of durations) `_TYPICAL_BOX`
    inches, so most boxes carry their label; where that is wider than the screen, the time
    axis wraps into bands as far as the height allows, then boxes get narrower. Rows shrink
    to fit many devices and grow so the figure is not flatter than `_FLATTEST`; the thin
    all-reduce rows of `reduce_devices` count as `REDUCE_ROW` of a row each."""
    # Zero-length actions (an I of a stage with no input gradient) never carry a label.
    durations = sorted(d for e in events if (d := e.end - e.start) > 0)
    short = durations[len(durations) // 4] if durations else 0.0
    wanted = _MIN_AXES_WIDTH
    if short > 0 and span > 0:
        wanted = max(_MIN_AXES_WIDTH, _TYPICAL_BOX * span / short)
    margins = MARGIN_LEFT + MARGIN_RIGHT
    dpi = 150 if (wanted + margins) * 150 <= MAX_WIDTH_PX else 100
    max_width, max_height = MAX_WIDTH_PX / dpi - margins, MAX_HEIGHT_PX / dpi
    P = max(num_devices, 1)
    units = P + REDUCE_ROW * len(reduce_devices)  # in device rows
    bands = max(1, math.ceil(wanted / max_width))
    while bands > 1 and _figure_height(_ROW_HEIGHT * units, bands) > max_height:
        bands -= 1
    width = min(max_width, max(_MIN_AXES_WIDTH, wanted / bands))
    rows_room = max_height - _figure_height(0.0, bands)
    row = min(_ROW_HEIGHT, rows_room / (units * bands))
    flattest = (width + margins) / _FLATTEST - _figure_height(0.0, bands)
    row = max(_MIN_ROW, row, min(_MAX_ROW, rows_room / (units * bands), flattest / (units * bands)))
    return TimelineLayout(width, row, P, bands, span, dpi, tuple(sorted(reduce_devices)))


def needs_overview(layout: TimelineLayout, events: Sequence[Event]) -> bool:
    """Whether a box per action would make a barcode: a typical (median) action narrower than
    `MIN_BOX_PX`, or more devices than `MAX_TIMELINE_DEVICES`."""
    if layout.num_devices > MAX_TIMELINE_DEVICES:
        return True
    durations = sorted(d for e in events if (d := e.end - e.start) > 0)
    return bool(durations) and layout.box_width_px(durations[len(durations) // 2]) < MIN_BOX_PX
