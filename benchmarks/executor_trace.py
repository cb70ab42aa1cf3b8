"""bench_executor.py's reading of our executor's per-action trace: each rank's step split into
compute, waits, gaps and the time outside actions, and the in-run op durations by stage and kind.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from octopipe.actions import Action
from octopipe.calibrate import collect_durations, profiled_duration, stage_scaled
from octopipe.plan import Plan
from octopipe.profile import Profile
from octopipe.runtime.step.records import ActionRecord


@dataclass(frozen=True)
class RankBreakdown:
    """Seconds per step (medians over the steps after the first) of one rank's time."""

    step: float
    compute: float  # sum of action durations, in the run
    compute_profiled: float  # the same actions' durations by the profile
    wait: float  # waiting for inputs (transfers, or the other rank)
    gaps: float  # between one action's end and the next one's wait: bookkeeping, posting receives
    tail: float  # outside actions: posting receives, pending sends, optimizer step, and the
    # time this rank finished before the slowest one (`step` is the slowest rank's)


def stage_kind(record: ActionRecord) -> tuple[int, str]:
    act = Action.parse(record.action)
    return act.stage, act.kind


def breakdown(
    profile: Profile, plan: Plan, records: Sequence[ActionRecord], step_times: Sequence[float]
) -> RankBreakdown:
    per_step: dict[int, list[ActionRecord]] = defaultdict(list)
    for r in records:
        per_step[r.step].append(r)
    rows = []
    for step, recs in sorted(per_step.items()):
        if step == 0 and len(per_step) > 1:
            continue
        compute = sum(r.end - r.start for r in recs)
        profiled = sum(profiled_duration(profile, plan, *stage_kind(r)) for r in recs)
        wait = sum(r.start - r.wait_start for r in recs)
        gaps = sum(b.wait_start - a.end for a, b in pairwise(recs))
        busy_span = recs[-1].end - recs[0].wait_start
        rows.append((step_times[step], compute, profiled, wait, gaps, step_times[step] - busy_span))
    return RankBreakdown(*(statistics.median(col) for col in zip(*rows)))


def in_run_durations(records: Sequence[Sequence[ActionRecord]]) -> dict:
    """Every action's in-run duration by stage and kind, steps after the first."""
    return collect_durations(
        (Action.parse(r.action), r.end - r.start) for rank in records for r in rank if r.step > 0
    )


def in_run_profile(
    profile: Profile, plan: Plan, records: Sequence[Sequence[ActionRecord]]
) -> Profile:
    """Each stage's f, b, w scaled to its in-run mean: what the simulator predicts from the op
    times that run measured."""
    return stage_scaled(profile, plan, in_run_durations(records))
