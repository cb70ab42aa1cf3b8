"""Pictures of a pipeline iteration, one module per kind of picture.

    from octopipe import viz
    viz.save_timeline(result, "plan.png")              # timeline.py (matplotlib; .png or .svg)
    viz.save_html_timeline(result, "plan.html")        # html.py: every action, hover and zoom
    viz.save_memory_plot(result, plan, profile, "mem.png")   # memory.py (matplotlib)
    print(viz.render_text_timeline(result, width=100))       # text.py
    # layout.py: the timeline's size; style.py: colours, shades per chunk, label sizes, headline
    # boxes.py: the action boxes the matplotlib pictures share; overview.py: big plans' picture

Everything here reads a `SimResult` or any sequence of `octopipe.actions.Event` (simulated or
measured: `octopipe.trace` reads both) and only draws it; the timelines also draw a
SimResult's data-parallel gradient all-reduces, on a thin row under each device. Names are
loaded on first use, so importing this package, `viz.text` or `viz.html` does not import
matplotlib.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "save_timeline": "timeline",
    "timeline_layout": "layout",
    "TimelineLayout": "layout",
    "timeline_rows": "layout",
    "TimelineRows": "layout",
    "save_memory_plot": "memory",
    "save_html_timeline": "html",
    "html_timeline": "html",
    "render_text_timeline": "text",
    "summarize": "style",
    "TimelineSummary": "style",
    "chunk_indices": "style",
    "shade": "style",
    "label_font_size": "style",
    "events_of": "style",
    "KIND_COLORS": "style",
    "KIND_NAMES": "style",
    "REDUCE_COLOR": "style",
    "reductions_of": "style",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'octopipe.viz' has no attribute {name!r}")
    return getattr(importlib.import_module(f"octopipe.viz.{_WHERE[name]}"), name)
