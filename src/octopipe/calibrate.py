"""Calibrate a profile from a measured run: how the run's op times relate to the profile's.

A profile times each layer alone; inside a run the same ops take longer or shorter (ranks
sharing cores and caches, communication threads, many microbatches in flight, a whole stage run
at once), and every action pays costs that do not grow with its layers (the executor's
bookkeeping, waking up after a wait). Over every stage and kind of action of a run, `fit_run`
fits

    mean in-run duration = scale x the profile's duration + overhead

by least squares. `scaled(profile, scale)` is the profile as the run sees it, and the overhead is
what `octopipe plan --action-overhead` takes: measure, plan, run, calibrate, plan again.
`stage_ratios` and `stage_scaled` give the same comparison stage by stage (for reading a run,
or for simulating exactly that plan with its own in-run op times).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from octopipe.actions import Action, B, F, I, W
from octopipe.costs import CostTable
from octopipe.errors import InputError
from octopipe.plan import Plan
from octopipe.profile import LayerCost, Profile
from octopipe.sim.graph import devices_for
from octopipe.trace import TracedAction

Durations = Mapping[tuple[int, str], Sequence[float]]  # (stage, kind) -> seconds, per action


def collect_durations(
    actions: Iterable[tuple[Action, float]],
) -> dict[tuple[int, str], list[float]]:
    """Group measured (action, seconds) pairs by stage and kind."""
    taken: dict[tuple[int, str], list[float]] = defaultdict(list)
    for action, seconds in actions:
        taken[(action.stage, action.kind)].append(seconds)
    return dict(taken)


def profiled_duration(profile: Profile, plan: Plan, stage: int, kind: str) -> float:
    """What the profile says one action of this stage and kind takes on its device (the
    layers' times, recomputed as the plan says, over the device's speed, as the simulator has
    it)."""
    st = plan.stages[stage]
    f, b, w = CostTable(profile).stage_times(st.start, st.end, plan.recompute_of(stage))
    speed = devices_for(profile, plan)[st.device].speed
    return {F: f, I: b, W: w, B: b + w}[kind] / speed


@dataclass(frozen=True)
class RunFit:
    """`in run = scale x profile + overhead` (seconds), least squares over (stage, kind) means."""

    scale: float
    overhead: float
    points: int


def fit_run(profile: Profile, plan: Plan, durations: Durations, where: str = "<run>") -> RunFit:
    """The scale and per-action overhead that best explain the run's mean op times."""
    _check(profile, plan, durations, where)
    pairs = [
        (profiled_duration(profile, plan, s, kind), statistics.fmean(taken))
        for (s, kind), taken in sorted(durations.items())
        if taken
    ]
    xs, ys = [x for x, _ in pairs], [y for _, y in pairs]
    if not any(xs):
        raise InputError(where, "no actions with a profiled time to compare")
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    scale = sum((x - mx) * (y - my) for x, y in pairs) / sxx if sxx > 0 else 0.0
    overhead = my - scale * mx
    if sxx == 0 or overhead < 0 or scale <= 0:
        # No spread to tell the two apart, a negative intercept, or times that fall as the
        # profile's rise: the best fit through the origin, a scale alone.
        scale = sum(x * y for x, y in pairs) / sum(x * x for x in xs)
        overhead = 0.0
    if not scale > 0:
        raise InputError(where, f"the run's op times do not fit the profile (scale {scale:.3g})")
    return RunFit(scale, overhead, len(pairs))


def scaled(profile: Profile, scale: float) -> Profile:
    """The profile with every layer's f, b, w times `scale` (memory figures kept)."""
    layers = tuple(_times_scaled(x, scale, scale, scale) for x in profile.layers)
    name = profile.name.removesuffix("-calibrated") + "-calibrated"
    return profile.model_copy(update={"layers": layers, "name": name})


@dataclass(frozen=True)
class StageRatios:
    """In-run over profiled time of one stage's actions (1.0 where the run had none)."""

    f: float
    b: float
    w: float


def stage_ratios(profile: Profile, plan: Plan, durations: Durations) -> list[StageRatios]:
    """Per stage: mean in-run duration over the profiled one, for F, I (or B) and W (or B)."""
    ratios = []
    for s in range(plan.num_stages):

        def ratio(kind: str, s: int = s) -> float:
            taken, profiled = durations.get((s, kind)), profiled_duration(profile, plan, s, kind)
            return statistics.fmean(taken) / profiled if taken and profiled > 0 else 1.0

        full = ratio(B)
        ratios.append(
            StageRatios(
                f=ratio(F),
                b=ratio(I) if (s, I) in durations else full,
                w=ratio(W) if (s, W) in durations else full,
            )
        )
    return ratios


def stage_scaled(
    profile: Profile, plan: Plan, durations: Durations, where: str = "<run>"
) -> Profile:
    """The profile with each layer's f, b, w scaled by its stage's in-run ratios: simulating
    `plan` on it uses the op times that run measured."""
    _check(profile, plan, durations, where)
    layers = list(profile.layers)
    for stage, r in zip(plan.stages, stage_ratios(profile, plan, durations)):
        for i in range(stage.start, stage.end):
            layers[i] = _times_scaled(layers[i], r.f, r.b, r.w)
    return profile.model_copy(update={"layers": tuple(layers)})


def _times_scaled(layer: LayerCost, f: float, b: float, w: float) -> LayerCost:
    """The layer with its times scaled, its recomputed backwards (`recompute`) as its `b`."""
    update: dict = {"f": layer.f * f, "b": layer.b * b, "w": layer.w * w}
    if layer.recompute is not None:
        update["recompute"] = layer.recompute.model_copy(
            update={
                kind: alt.model_copy(update={"b": alt.b * b})
                for kind in ("full", "selective")
                if (alt := layer.recompute.of(kind)) is not None
            }
        )
    return layer.model_copy(update=update)


def check_trace_of_plan(traced: Iterable[TracedAction], plan: Plan, where: str) -> None:
    """A trace to fit is of this plan: each action one its schedule holds, on the device that
    runs it (a trace of another plan would fit its times to the wrong stages)."""
    scheduled = {(d, a) for d, acts in plan.schedule.items() for a in acts}
    for t in traced:
        e = t.event
        if (e.device, e.action) not in scheduled:
            raise InputError(
                where,
                f"action {e.action} on device {e.device} is not in the plan's schedule: a trace "
                "of another plan",
            )


def _check(profile: Profile, plan: Plan, durations: Durations, where: str) -> None:
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
