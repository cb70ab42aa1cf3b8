"""Lower bounds on a step's time, each proven for the simulator's semantics (docs/FORMATS.md,
"Bounds") and computed in milliseconds:

    joint_bound(profile, devices, M)      # any partition, placement and order
    plan_bound(graph)                     # any order of this plan's partition and placement

`joint_bound` knows that layers cannot be split and that a pipeline must fill and drain:

- **capacity with fill**: a device whose first layer is `i` cannot start before microbatch 0's
  forward reached layer `i` (`F(<i)`, at the fastest speed, transfers free), and its forward
  and input-gradient work must end before the last microbatch's input gradient has left layers
  `< i` (`B(<i)`). The first layers of distinct devices are distinct, so the devices together
  hold at most `sum_j s_j (T - F(<j) - B(<j))` seconds of F and B work over `j = 0, 1, ...`
  paired fastest first: T is at least where that reaches the step's F and B work (and
  likewise for all the work, whose window ends at T);
- **the heaviest layer's chain**: the device holding layer `l` does all its microbatches' work
  of it after `F(<l)` and, for F and B, before the last `B(<l)`;
- **atomic layers**: the devices hold the `n` heaviest layers between them, a device of speed
  `s` at most as many as fit under `T s` lightest first (of `k P + 1` equal-speed devices one
  holds `k + 1`): T is at least where they first hold all `n`.

`plan_bound` fixes the stages and their devices: each action's head (the longest chain of
dependencies and transfers before it) and tail (after it) are what any order must respect, and
each device is a single machine that must run its actions between them. The preemptive
single-machine relaxation (Jackson's schedule: always the released action of the longest tail)
gives the least time over all orders of that device, a bound on the step (Carlier 1982); the
plan bound is the largest over the devices, and never below the joint bound.

Neither counts data-parallel reductions, recomputation or memory: both remain bounds of the
synchronous step as simulated, never beaten (tests/test_bounds.py). With steps overlapped
(`--overlap-steps`) the pipeline's fill is paid once, not each step: they do not apply.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass
from itertools import accumulate

from octopipe.actions import F_CODE, NUM_KINDS, W_CODE
from octopipe.profile import Device, Profile
from octopipe.sim.graph import NO_DEP, Graph


@dataclass(frozen=True)
class Bounds:
    """The least step time any order of a plan's partition and placement can reach (`plan`),
    and any plan at all (`joint`), in seconds."""

    plan: float
    joint: float

    def gap(self, time: float) -> float:
        """How far `time` is above the joint bound: 0.05 = 5% slower than any plan could be."""
        return time / self.joint - 1 if self.joint > 0 else 0.0

    def describe(self, time: float) -> str:
        return (
            f"within {self.gap(time):.1%} of the best any plan can do (no plan beats "
            f"{self.joint:.4g} s; no order of this partition and placement beats "
            f"{self.plan:.4g} s)"
        )

    def to_json(self) -> dict[str, float]:
        return {"plan": self.plan, "joint": self.joint}


def joint_bound(profile: Profile, devices: tuple[Device, ...], num_microbatches: int) -> float:
    """The least step time of any plan of `profile` on `devices` (module docstring)."""
    layers = profile.layers
    M = num_microbatches
    fastest = max(d.speed for d in devices)
    speeds = sorted((d.speed for d in devices), reverse=True)
    f = [layer.f for layer in layers]
    fb = [layer.f + layer.b for layer in layers]
    before_f = [0.0, *accumulate(f)]  # F(<i)
    before_fb = [0.0, *accumulate(fb)]  # F(<i) + B(<i)
    firsts = min(len(speeds), len(layers))  # the devices' first layers are distinct
    starts = [x / fastest for x in before_f[:firsts]]
    windows = [x / fastest for x in before_fb[:firsts]]
    bound = max(
        _filled(speeds, starts, M * sum(layer.work for layer in layers)),
        _filled(speeds, windows, M * sum(fb)),
    )
    for i, layer in enumerate(layers):  # the device holding layer i
        chain = max(before_fb[i] + M * fb[i], before_f[i] + M * layer.work)
        bound = max(bound, chain / fastest)
    return max(bound, M * _packed([layer.work for layer in layers], speeds))


def _packed(works: list[float], speeds: list[float]) -> float:
    """The least time per microbatch of the device slowest to finish its layers, layers being
    indivisible: of the `n` heaviest layers the devices hold counts `c_d` adding up to `n`,
    and a device holding `c` of them works at least their `c` lightest for `c` of them; the
    least T at which every device's count fits under `T s_d` must hold all `n` (each `n` a
    bound: those of the pigeonhole, `k P + 1`, and a geometric few)."""
    heavy = sorted(works, reverse=True)
    P, L = len(speeds), len(heavy)
    counts = {L, *range(1, min(L, 64) + 1)}
    counts |= {k * P + 1 for k in range(1, 257) if k * P + 1 <= L}
    n = 64.0
    while n < L:
        counts.add(int(n))
        n *= 1.25
    return max(_least_time(heavy[:n][::-1], speeds) for n in sorted(counts))


def _least_time(lightest_first: list[float], speeds: list[float]) -> float:
    """The largest T (to a part in 1e9) at which the devices, each taking the most of these
    layers whose lightest-first sum fits under T times its speed, cannot take them all."""
    sums = [0.0, *accumulate(lightest_first)]
    n = len(lightest_first)

    def holds_all(t: float) -> bool:
        return sum(bisect.bisect_right(sums, t * s) - 1 for s in speeds) >= n

    lo, hi = 0.0, sums[-1] / min(speeds)  # the slowest device alone takes them all
    while hi - lo > 1e-9 * hi:
        mid = (lo + hi) / 2
        if holds_all(mid):
            hi = mid
        else:
            lo = mid
    return lo


def _filled(speeds: list[float], lost: list[float], work: float) -> float:
    """The least T with `sum_j speeds[j] * max(0, T - lost[j]) >= work` (speeds fastest first,
    `lost` nondecreasing): where the devices' capacity, each starting late by its `lost`,
    reaches the work."""
    rate = paid = 0.0
    for j, (s, late) in enumerate(zip(speeds, lost, strict=False)):
        rate += s
        paid += s * late
        t = (work + paid) / rate
        if j + 1 == min(len(speeds), len(lost)) or t <= lost[j + 1]:
            return t
    return 0.0


def plan_bound(graph: Graph, joint: float = 0.0) -> float:
    """The least step time of any order of `graph`'s stages on their devices (module
    docstring), and never below `joint`."""
    dur: dict[int, float] = {}
    deps: dict[int, tuple[tuple[int, float], ...]] = {}
    device_of: dict[int, int] = {}
    for d, row in enumerate(graph.rows):
        for aid, duration, dep1, lag1, dep2, lag2 in row:
            dur[aid], device_of[aid] = duration, d
            deps[aid] = tuple((p, lag) for p, lag in ((dep1, lag1), (dep2, lag2)) if p != NO_DEP)
    order = sorted(dur, key=lambda aid: _topological_key(aid, graph))
    head = dict.fromkeys(order, 0.0)
    for aid in order:
        for p, lag in deps[aid]:
            head[aid] = max(head[aid], head[p] + dur[p] + lag)
    tail = dict.fromkeys(order, 0.0)
    for aid in reversed(order):
        for p, lag in deps[aid]:
            tail[p] = max(tail[p], lag + dur[aid] + tail[aid])
    jobs: list[list[tuple[float, float, float]]] = [[] for _ in graph.rows]
    for aid in order:
        jobs[device_of[aid]].append((head[aid], dur[aid], tail[aid]))
    return max([joint, *(_one_machine(js) for js in jobs)])


def _topological_key(aid: int, graph: Graph) -> tuple[int, int]:
    """Every dependency before its dependents: forwards by stage, then backwards (I or B) from
    the last stage, then the weight gradients."""
    stage = aid // NUM_KINDS // graph.plan.num_microbatches
    code = aid % NUM_KINDS
    if code == F_CODE:
        return (0, stage)
    if code == W_CODE:
        return (2, stage)
    return (1, -stage)  # I or B


def _one_machine(jobs: list[tuple[float, float, float]]) -> float:
    """Jackson's preemptive schedule of (head, duration, tail) jobs on one machine: the least
    max over jobs of end + tail, preemption allowed (a bound on any order without it)."""
    if not jobs:
        return 0.0
    jobs = sorted(jobs)
    ready: list[tuple[float, float]] = []  # (-tail, time left)
    t = best = 0.0
    i, n = 0, len(jobs)
    while i < n or ready:
        if not ready and jobs[i][0] > t:
            t = jobs[i][0]
        while i < n and jobs[i][0] <= t:
            heapq.heappush(ready, (-jobs[i][2], jobs[i][1]))
            i += 1
        neg_tail, left = heapq.heappop(ready)
        until = jobs[i][0] if i < n else float("inf")
        ran = min(left, until - t)
        t += ran
        if left - ran > 1e-15:
            heapq.heappush(ready, (neg_tail, left - ran))
        else:
            best = max(best, t - neg_tail)
    return best
