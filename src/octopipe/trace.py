"""Chrome/Perfetto traces of pipeline iterations: one schema for simulated and measured runs.

    write_trace("sim.json", result.events)                      # simulator: bare Events
    write_trace("run.json", from_records(result.records), "measured")   # executor, per rank
    traced = read_trace("run.json", steps=[1, 2])               # -> tuple[TracedAction, ...]
    per_step = events_by_step(traced)                           # {step: (Event, ...)}
    events = load_events("sim.json")                            # the actions as Events

The schema (docs/FORMATS.md, "Trace") is the JSON object format of the Chrome trace viewer,
which ui.perfetto.dev opens: one process per device (pid = device, one thread, tid 0), one
complete event ("X") per action named in `torch.distributed.pipelining` notation with its
stage, kind, microbatch and (measured runs) training step in `args`, and a "wait" event before
an action that waited for its inputs. Times are microseconds. The reader also takes the two
older layouts this project wrote (the simulator's, with one thread per device, and the
executor's, with only the step in `args`). No plotting library is imported here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from octopipe.actions import Action, Event, Kind
from octopipe.errors import InputError

FORMAT = "octopipe.trace/1"
WAIT = "wait"
_US = 1e6
_MIN_WAIT_S = 1e-6  # waits shorter than this are bookkeeping, not worth an event


@dataclass(frozen=True)
class TracedAction:
    """One action of a trace: its Event, and what a measured run adds to it."""

    event: Event
    step: int | None = None  # training step (measured runs); None in a simulated trace
    wait_start: float | None = None  # seconds; when it began waiting for its inputs, if it did

    @property
    def wait(self) -> float:
        """Seconds it waited for its inputs before it started (0 when none was recorded)."""
        return 0.0 if self.wait_start is None else self.event.start - self.wait_start


class _Record(Protocol):  # the executor's ActionRecord (runtime/step/worker.py), without torch
    step: int
    action: str
    wait_start: float
    start: float
    end: float


def from_records(records_per_rank: Sequence[Sequence[_Record]]) -> tuple[TracedAction, ...]:
    """The executor's per-rank action records (rank = device) as traced actions."""
    return tuple(
        TracedAction(Event(rank, Action.parse(r.action), r.start, r.end), r.step, r.wait_start)
        for rank, records in enumerate(records_per_rank)
        for r in records
    )


def _traced(item: Event | TracedAction) -> TracedAction:
    return item if isinstance(item, TracedAction) else TracedAction(item)


# --- writing ------------------------------------------------------------------------------------


def trace_document(
    items: Iterable[Event | TracedAction], process_name: str = "octopipe"
) -> dict[str, Any]:
    """The trace of these actions (Events, or TracedActions with steps and waits) as a JSON
    object; devices are named "{process_name}: device {d}"."""
    traced = [_traced(x) for x in items]
    out: list[dict[str, Any]] = []
    for d in sorted({t.event.device for t in traced}):
        out += [
            _meta("process_name", d, {"name": f"{process_name}: device {d}"}),
            _meta("process_sort_index", d, {"sort_index": d}),
            _meta("thread_name", d, {"name": "compute"}),
        ]
    for t in traced:
        e, a = t.event, t.event.action
        step = {} if t.step is None else {"step": t.step}
        if t.wait_start is not None and t.wait > _MIN_WAIT_S:
            out.append(
                _span(WAIT, WAIT, e.device, t.wait_start, e.start, {**step, "action": str(a)})
            )
        args = {"stage": a.stage, "kind": str(a.kind), "microbatch": a.mb, **step}
        out.append(_span(str(a), str(a.kind), e.device, e.start, e.end, args))
    return {"format": FORMAT, "traceEvents": out, "displayTimeUnit": "ms"}


def write_trace(
    path: str | Path, items: Iterable[Event | TracedAction], process_name: str = "octopipe"
) -> Path:
    """Write `trace_document(items, process_name)` to `path`; open it in ui.perfetto.dev."""
    from octopipe.jsonfile import write_json

    path = Path(path)
    write_json(path, trace_document(items, process_name), indent=None)
    return path


def _meta(name: str, device: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": device, "tid": 0, "args": args}


def _span(
    name: str, cat: str, device: int, start: float, end: float, args: dict[str, Any]
) -> dict[str, Any]:
    return {
        "name": name,
        "cat": cat,
        "ph": "X",
        "pid": device,
        "tid": 0,
        "ts": start * _US,
        "dur": max(end - start, 0.0) * _US,
        "args": args,
    }


# --- reading ------------------------------------------------------------------------------------


def parse_trace(
    data: Any, where: str = "<trace>", steps: Iterable[int] | None = None
) -> tuple[TracedAction, ...]:
    """The actions of a trace document, in file order, each with its step and its wait (a
    "wait" event just before it on its device). `steps` keeps only those training steps'
    actions. Events that are no action (metadata, waits, anything else) are not returned."""
    raw = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(raw, list):
        raise InputError(where, "expected a trace object with a 'traceEvents' list")
    keep = None if steps is None else set(steps)
    out = []
    waiting: dict[int, float] = {}  # device -> start of the wait its next action ends
    for i, item in enumerate(raw):
        if not (isinstance(item, dict) and item.get("ph") == "X"):
            continue
        args = item.get("args")
        args = args if isinstance(args, dict) else {}
        try:
            if item.get("name") == WAIT or item.get("cat") == WAIT:
                waiting[_count(item, "pid")] = _seconds(item, "ts")
                continue
            action = _action(item, args)
            if action is None:
                continue
            device = _count(item, "pid")
            start = _seconds(item, "ts")
            end = start + _seconds(item, "dur", minimum=0.0)
        except _Malformed as exc:
            raise InputError(where, str(exc), f"traceEvents[{i}]") from None
        step = args.get("step")
        step = step if _is_count(step) else None
        wait_start = waiting.pop(device, None)
        if keep is not None and step not in keep:
            continue
        out.append(TracedAction(Event(device, action, start, end), step, wait_start))
    return tuple(out)


class _Malformed(ValueError):
    """An action event whose fields are not what the schema says."""


def _is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _count(item: dict[str, Any], key: str) -> int:
    value = item.get(key)
    if not _is_count(value):
        raise _Malformed(f"{key}: expected an integer >= 0, got {value!r}")
    return value


def _seconds(item: dict[str, Any], key: str, minimum: float = -math.inf) -> float:
    """A microsecond field as seconds (strict JSON has made every number finite)."""
    value = item.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
        bound = "" if minimum == -math.inf else f" >= {minimum:g}"
        raise _Malformed(f"{key}: expected a number of microseconds{bound}, got {value!r}")
    return value / _US


def _action(item: dict[str, Any], args: dict[str, Any]) -> Action | None:
    """The action an "X" event stands for, from its args or else its name; None for events
    that are no action."""
    if "stage" in args:
        kind = args.get("kind")
        if kind not in {str(k) for k in Kind}:
            raise _Malformed(f"args.kind: expected one of F, B, I, W, got {kind!r}")
        return Action(_count(args, "stage"), Kind(kind), _count(args, "microbatch"))
    try:
        return Action.parse(str(item.get("name", "")))
    except ValueError:
        return None


def read_trace(path: str | Path, steps: Iterable[int] | None = None) -> tuple[TracedAction, ...]:
    """`parse_trace` of a file; faults name the file."""
    from octopipe.jsonfile import read_json

    return parse_trace(read_json(path), str(path), steps)


def load_events(path: str | Path, steps: Iterable[int] | None = None) -> tuple[Event, ...]:
    """The actions of a trace file as Events (e.g. to draw a measured run)."""
    return tuple(t.event for t in read_trace(path, steps))


def events_by_step(traced: Iterable[TracedAction]) -> dict[int | None, tuple[Event, ...]]:
    """The actions of each training step, steps in increasing order (None, for actions
    without a step, last)."""
    groups: dict[int | None, list[Event]] = {}
    for t in traced:
        groups.setdefault(t.step, []).append(t.event)
    order = sorted(groups, key=lambda s: (s is None, s or 0))
    return {s: tuple(groups[s]) for s in order}


def normalized_events(events: Iterable[Event]) -> tuple[Event, ...]:
    """The events sorted by device and start, shifted so the first starts at 0 (measured
    traces carry clock times)."""
    events = tuple(events)
    if not events:
        return ()
    t0 = min(e.start for e in events)
    if t0 != 0.0:
        events = tuple(Event(e.device, e.action, e.start - t0, e.end - t0) for e in events)
    return tuple(sorted(events, key=lambda e: (e.device, e.start)))
