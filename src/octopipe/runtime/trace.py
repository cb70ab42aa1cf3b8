"""Per-action timings of every rank as one Chrome/Perfetto trace (`traceEvents`, pid = rank).

Each action becomes a complete event ("X") on its rank's row; the time it spent waiting for its
inputs, when there was any, becomes a "wait" event just before it, so bubbles can be told apart
from slow transfers. Times are microseconds since the run's common start barrier.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from octopipe.actions import Action
from octopipe.runtime.worker import ActionRecord

_US = 1e6
_MIN_WAIT_S = 1e-6  # waits shorter than this are bookkeeping, not worth an event


def trace_events(records_per_rank: tuple[tuple[ActionRecord, ...], ...]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for rank, records in enumerate(records_per_rank):
        events.append(
            {"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}}
        )
        for r in records:
            if r.start - r.wait_start > _MIN_WAIT_S:
                events.append(_complete("wait", "wait", rank, r.wait_start, r.start, r.step))
            events.append(
                _complete(r.action, Action.parse(r.action).kind, rank, r.start, r.end, r.step)
            )
    return events


def _complete(
    name: str, category: str, rank: int, start: float, end: float, step: int
) -> dict[str, Any]:
    return {
        "name": name,
        "cat": category,
        "ph": "X",
        "pid": rank,
        "tid": 0,
        "ts": start * _US,
        "dur": max(end - start, 0.0) * _US,
        "args": {"step": step},
    }


def write_trace(path: str | Path, records_per_rank: tuple[tuple[ActionRecord, ...], ...]) -> None:
    doc = {"traceEvents": trace_events(records_per_rank), "displayTimeUnit": "ms"}
    Path(path).write_text(json.dumps(doc) + "\n")
