"""Calibrate a profile from a measured run: every layer's f, b, w scaled to what its stage's
actions took in the run.

A profile times each layer alone; inside a run the same ops may take longer or shorter (ranks
sharing cores, communication threads, many microbatches in flight, a whole stage run at once).
Measure, plan, run, then calibrate with the run's trace and plan again: the second plan's
prediction rests on op times as the executor sees them. For each stage and kind of action, the
ratio is the mean in-run duration over the profile's figure for that stage: F scales `f`; I and W
scale `b` and `w`; a stage run with full backward B scales `b` and `w` alike. A layer takes its
stage's ratios, so a later plan may cut the model elsewhere. Memory figures are kept.

A run's ops also pay costs that do not grow with their layers (the executor's bookkeeping,
waking up after a wait): `fit_overhead` fits `in run = scale x profile + overhead` over every
stage and kind, and the overhead is what `octopipe plan --action-overhead` takes.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from octopipe.errors import InputError
from octopipe.plan import Action, B, F, I, Plan, W
from octopipe.profile import Profile

Durations = Mapping[tuple[int, str], Sequence[float]]  # (stage, kind) -> seconds, per action


@dataclass(frozen=True)
class StageRatios:
    """In-run over profiled time of one stage's actions (1.0 where the run had none)."""

    f: float
    b: float
    w: float


def collect_durations(actions: Iterable[tuple[Action, float]]) -> dict[tuple[int, str], list]:
    """Group measured (action, seconds) pairs by stage and kind."""
    taken: dict[tuple[int, str], list[float]] = defaultdict(list)
    for action, seconds in actions:
        taken[(action.stage, action.kind)].append(seconds)
    return dict(taken)


def stage_ratios(profile: Profile, plan: Plan, durations: Durations) -> list[StageRatios]:
    ratios = []
    for s, stage in enumerate(plan.stages):
        layers = profile.layers[stage.start : stage.end]
        f, b, w = (sum(getattr(x, k) for x in layers) for k in "fbw")
        full = _ratio(durations.get((s, B)), b + w)
        ratios.append(
            StageRatios(
                f=_ratio(durations.get((s, F)), f),
                b=_ratio(durations[(s, I)], b) if (s, I) in durations else full,
                w=_ratio(durations[(s, W)], w) if (s, W) in durations else full,
            )
        )
    return ratios


@dataclass(frozen=True)
class OverheadFit:
    """`in run = scale x profile + overhead` (seconds), least squares over (stage, kind) means."""

    scale: float
    overhead: float
    points: int


def fit_overhead(profile: Profile, plan: Plan, durations: Durations) -> OverheadFit:
    """The scale and per-action overhead that best explain the run's mean op times."""
    xs, ys = [], []
    for (s, kind), taken in sorted(durations.items()):
        if not (0 <= s < plan.num_stages) or not taken:
            continue
        layers = profile.layers[plan.stages[s].start : plan.stages[s].end]
        f, b, w = (sum(getattr(x, k) for x in layers) for k in "fbw")
        xs.append({F: f, I: b, W: w, B: b + w}[kind])
        ys.append(statistics.fmean(taken))
    if not xs or not any(xs):
        raise InputError("<run>", "no actions with a profiled time to fit")
    n = len(xs)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    scale = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
    overhead = my - scale * mx
    if sxx == 0 or overhead < 0:  # no spread to separate the two, or no overhead: scale only
        scale = sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
        overhead = 0.0
    return OverheadFit(scale, overhead, n)


def calibrate(profile: Profile, plan: Plan, durations: Durations, where: str = "<run>") -> Profile:
    """The profile with each layer's f, b, w scaled by its stage's in-run ratios."""
    unknown = sorted({s for s, _ in durations if not 0 <= s < plan.num_stages})
    if unknown:
        raise InputError(
            where, f"actions of stage {unknown[0]}, but the plan has {plan.num_stages} stages"
        )
    if plan.stages[-1].end != profile.num_layers:
        raise InputError(
            where,
            f"the plan covers {plan.stages[-1].end} layers, the profile has {profile.num_layers}",
        )
    layers = list(profile.layers)
    for stage, r in zip(plan.stages, stage_ratios(profile, plan, durations)):
        for i in range(stage.start, stage.end):
            x = layers[i]
            layers[i] = x.model_copy(update={"f": x.f * r.f, "b": x.b * r.b, "w": x.w * r.w})
    name = profile.name.removesuffix("-calibrated") + "-calibrated"
    return profile.model_copy(update={"layers": tuple(layers), "name": name})


def _ratio(durations: Sequence[float] | None, profiled: float) -> float:
    """Mean in-run duration over the profiled one (a mean keeps the in-run total)."""
    return statistics.fmean(durations) / profiled if durations and profiled > 0 else 1.0
