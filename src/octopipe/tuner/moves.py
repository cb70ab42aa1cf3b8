"""Neighbours of a scheduled candidate, aimed at where its devices idle or overflow.

`diagnose` reads an outcome: which devices bound the iteration (most busy), which starve (most
idle) and which lack memory. `neighbours` proposes the moves that address those: shift a layer
across a boundary of a bound or overflowing device's stages, hand one of its stages to (or trade
one with) the idlest device, exchange two devices' roles, merge two adjacent stages of one
device, deepen or shallow the warm-up (globally or of one device), and flip the scheduling rules.
`kick` perturbs a candidate at random to leave a local optimum. `recompute_moves` change what
stages recompute where memory binds (AdaPipe's per-stage variable).
All functions are pure; the search (`local_search.py`) decides what to keep.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass

from octopipe.plan import NO_RECOMPUTE, RECOMPUTE_KINDS
from octopipe.tuner.candidate import Candidate, Outcome

WARMUP_STEPS = (0.8, 1.25)
MAX_WARMUP = 8.0
Offers = Callable[[int, int, str], bool]  # whether layers [a, b) can be recomputed so


@dataclass(frozen=True)
class Diagnosis:
    bound: tuple[int, ...]  # devices by busy time, most busy first
    starved: tuple[int, ...]  # devices by idle time, most idle first
    overflowing: tuple[int, ...]  # devices that lack memory, worst first
    roomiest: int  # the device with most memory to spare


def diagnose(outcome: Outcome) -> Diagnosis:
    nd = len(outcome.busy)
    devs = range(nd)
    excess = outcome.excess
    headroom = [c - p for c, p in zip(outcome.capacity, outcome.peak_bytes)]
    return Diagnosis(
        bound=tuple(sorted(devs, key=lambda d: -outcome.busy[d])),
        starved=tuple(sorted(devs, key=lambda d: outcome.busy[d])),
        overflowing=tuple(sorted((d for d in devs if excess[d] > 0), key=lambda d: -excess[d])),
        roomiest=max(devs, key=lambda d: headroom[d]),
    )


def neighbours(outcome: Outcome, focus: int = 2) -> list[Candidate]:
    """Moves addressing the `focus` most binding devices (or the overflowing ones)."""
    cand = outcome.candidate
    diag = diagnose(outcome)
    targets = diag.overflowing[:focus] if diag.overflowing else diag.bound[:focus]
    out: list[Candidate] = []
    for d in targets:
        out += _shed_layers(cand, d)
    if not diag.overflowing:
        out += _take_layers(cand, diag.starved[0])
    if cand.tail_w:  # overlapped steps: steady-state idle is spread thin, try every device
        out += _tail_changes(cand, diag, targets)
        out += _per_device_changes(cand, diag.starved)
    spare = diag.roomiest if diag.overflowing else diag.starved[0]
    out += _reassign_stages(cand, targets[0], spare)
    out += _merges(cand)
    out += _device_swaps(cand, diag, targets)
    out += _warmup_changes(cand, diag, targets)
    out += _rule_flips(cand)
    seen, unique = {cand}, []
    for c in out:
        if c not in seen:
            seen.add(c)
            unique.append(c)
    return unique


def _with_bounds(cand: Candidate, bounds: list[int]) -> Candidate:
    return cand.but(ranges=tuple(itertools.pairwise(bounds)))


def _bounds(cand: Candidate) -> list[int]:
    return [a for a, _ in cand.ranges] + [cand.ranges[-1][1]]


def _shed_layers(cand: Candidate, device: int) -> list[Candidate]:
    """Each stage of `device` gives its first or last layer to the neighbouring stage."""
    bounds, S, out = _bounds(cand), len(cand.ranges), []
    for s in (s for s, d in enumerate(cand.placement) if d == device):
        if bounds[s + 1] - bounds[s] < 2:
            continue
        if s > 0:
            out.append(_with_bounds(cand, bounds[:s] + [bounds[s] + 1] + bounds[s + 1 :]))
        if s < S - 1:
            out.append(_with_bounds(cand, bounds[: s + 1] + [bounds[s + 1] - 1] + bounds[s + 2 :]))
    return out


def _take_layers(cand: Candidate, device: int) -> list[Candidate]:
    """Each stage of `device` takes one layer from a neighbouring stage that can spare it."""
    bounds, S, out = _bounds(cand), len(cand.ranges), []
    for s in (s for s, d in enumerate(cand.placement) if d == device):
        if s > 0 and bounds[s] - bounds[s - 1] >= 2:
            out.append(_with_bounds(cand, bounds[:s] + [bounds[s] - 1] + bounds[s + 1 :]))
        if s < S - 1 and bounds[s + 2] - bounds[s + 1] >= 2:
            out.append(_with_bounds(cand, bounds[: s + 1] + [bounds[s + 1] + 1] + bounds[s + 2 :]))
    return out


def _merges(cand: Candidate) -> list[Candidate]:
    """Adjacent stages on one device become one (fewer stages there: uneven chunk counts),
    recomputing what the more recomputing of the two did."""
    out = []
    for s in range(len(cand.ranges) - 1):
        if cand.placement[s] == cand.placement[s + 1]:
            merged = (cand.ranges[s][0], cand.ranges[s + 1][1])
            ranges = cand.ranges[:s] + (merged,) + cand.ranges[s + 2 :]
            placement = cand.placement[: s + 1] + cand.placement[s + 2 :]
            recompute = cand.recompute
            if recompute:
                both = max(recompute[s], recompute[s + 1], key=RECOMPUTE_KINDS.index)
                recompute = recompute[:s] + (both,) + recompute[s + 2 :]
            out.append(cand.but(ranges=ranges, placement=placement, recompute=recompute))
    return out


def _reassign_stages(cand: Candidate, device: int, spare: int) -> list[Candidate]:
    """A stage of `device` moves to `spare`, or trades places with one of spare's stages."""
    if device == spare:
        return []
    mine = [s for s, d in enumerate(cand.placement) if d == device]
    theirs = [s for s, d in enumerate(cand.placement) if d == spare]
    out = []
    for s in mine:
        if len(mine) > 1:
            out.append(cand.but(placement=_placed(cand.placement, {s: spare})))
        for t in theirs:
            out.append(cand.but(placement=_placed(cand.placement, {s: spare, t: device})))
    return out


def _placed(placement: tuple[int, ...], changes: dict[int, int]) -> tuple[int, ...]:
    return tuple(changes.get(s, d) for s, d in enumerate(placement))


def swap_devices(cand: Candidate, a: int, b: int) -> Candidate:
    """Devices a and b exchange all their stages."""
    swap = {a: b, b: a}
    return cand.but(placement=tuple(swap.get(d, d) for d in cand.placement))


def _device_swaps(cand: Candidate, diag: Diagnosis, targets: tuple[int, ...]) -> list[Candidate]:
    """A bound or overflowing device trades places with the one with most to spare."""
    spare = diag.roomiest if diag.overflowing else diag.starved[0]
    return [swap_devices(cand, d, spare) for d in targets if d != spare]


def _warmup_changes(cand: Candidate, diag: Diagnosis, targets: tuple[int, ...]) -> list[Candidate]:
    out = [cand.but(warmup=min(MAX_WARMUP, cand.warmup * k)) for k in WARMUP_STEPS]
    extra = list(cand.extra) if cand.extra else [0] * len(diag.bound)
    for d in (*targets, diag.starved[0]):
        for step in (-1, 1):
            changed = extra.copy()
            changed[d] += step
            out.append(cand.but(extra=tuple(changed)))
    return out


def _tail_changes(cand: Candidate, diag: Diagnosis, targets: tuple[int, ...]) -> list[Candidate]:
    """Overlapped steps: one W more or fewer kept for the end of the step, on the idlest and the
    most binding devices. A candidate of the synchronous search has no tail_w at all (an empty
    tuple, not zeros) and gets no such move."""
    if not cand.tail_w:
        return []
    out = []
    for d in dict.fromkeys((diag.starved[0], *targets)):
        for step in (1, -1):
            if cand.tail_w[d] + step >= 0:
                changed = list(cand.tail_w)
                changed[d] += step
                out.append(cand.but(tail_w=tuple(changed)))
    return out


def _per_device_changes(cand: Candidate, devices: tuple[int, ...]) -> list[Candidate]:
    """`device_moves` on each of `devices` in turn (the idlest first)."""
    return [c for d in devices for c in device_moves(cand, d)]


def device_moves(cand: Candidate, d: int) -> list[Candidate]:
    """Overlapped steps: one microbatch more or fewer in flight on device d, and one W more or
    fewer kept for the step's end."""
    extra = list(cand.extra) if cand.extra else [0] * len(cand.tail_w)
    out = []
    for step in (1, -1):
        changed = extra.copy()
        changed[d] += step
        out.append(cand.but(extra=tuple(changed)))
        if cand.tail_w[d] + step >= 0:
            tails = list(cand.tail_w)
            tails[d] += step
            out.append(cand.but(tail_w=tuple(tails)))
    return out


def _rule_flips(cand: Candidate) -> list[Candidate]:
    return [
        cand.but(split_backward=not cand.split_backward),
        cand.but(defer_w=not cand.defer_w),
        cand.but(backward_first=not cand.backward_first),
        cand.but(oldest_first=not cand.oldest_first),
    ]


def kick(cand: Candidate, rng: random.Random, strength: int = 3) -> Candidate:
    """Shift `strength` random inner boundaries by one layer each (keeping stages non-empty)."""
    bounds = _bounds(cand)
    S = len(cand.ranges)
    if S < 2:
        return cand.but(warmup=min(MAX_WARMUP, cand.warmup * rng.choice(WARMUP_STEPS)))
    for _ in range(strength):
        k = rng.randrange(1, S)
        moved = bounds[k] + rng.choice((-1, 1))
        if bounds[k - 1] < moved < bounds[k + 1]:
            bounds[k] = moved
    return _with_bounds(cand, bounds)


def recompute_moves(outcome: Outcome, offers: Offers) -> list[Candidate]:
    """What stages recompute, changed where memory binds: on each device that lacks memory, or
    whose schedule memory held back (a deeper warm-up needs room), each stage recomputes one
    kind more, or all of them everything; on the two busiest devices, each stage that
    recomputes does one kind less, or nothing (time back once memory allows)."""
    cand = outcome.candidate
    diag = diagnose(outcome)
    waits = outcome.schedule.memory_waits
    tight = diag.overflowing or tuple(d for d in diag.bound if waits and waits[d])
    kinds = cand.recompute or (NO_RECOMPUTE,) * len(cand.ranges)
    out = []
    for d in tight:
        mine = [s for s, dev in enumerate(cand.placement) if dev == d]
        for s in mine:
            stronger = _next_kind(kinds[s], cand.ranges[s], offers, +1)
            if stronger is not None:
                out.append(_recomputing(cand, kinds, {s: stronger}))
        every = {s: "full" for s in mine if offers(*cand.ranges[s], "full")}
        if len(every) > 1:
            out.append(_recomputing(cand, kinds, every))
    for d in diag.bound[:2]:
        for s in (s for s, dev in enumerate(cand.placement) if dev == d):
            if kinds[s] == NO_RECOMPUTE:
                continue
            weaker = _next_kind(kinds[s], cand.ranges[s], offers, -1)
            out.append(_recomputing(cand, kinds, {s: weaker or NO_RECOMPUTE}))
            if weaker not in (None, NO_RECOMPUTE):
                out.append(_recomputing(cand, kinds, {s: NO_RECOMPUTE}))
    return out


def _next_kind(kind: str, stage: tuple[int, int], offers: Offers, step: int) -> str | None:
    """The next recomputation kind the stage's layers offer, one way or the other."""
    i = RECOMPUTE_KINDS.index(kind) + step
    while 0 <= i < len(RECOMPUTE_KINDS):
        if offers(*stage, RECOMPUTE_KINDS[i]):
            return RECOMPUTE_KINDS[i]
        i += step
    return None


def _recomputing(cand: Candidate, kinds: tuple[str, ...], changes: dict[int, str]) -> Candidate:
    recompute = tuple(changes.get(s, k) for s, k in enumerate(kinds))
    return cand.but(recompute=() if all(k == NO_RECOMPUTE for k in recompute) else recompute)
