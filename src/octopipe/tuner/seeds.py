"""The tuner's starting points: balanced partitions under every seed placement, and the
filter that keeps the seeds a phase may start from.

`seed_candidates` builds the seeds of each placement `placement.seed_placements` lists (up to a
chunk count), each partition balanced for it, at a moderate and a deep warm-up; `startable`
keeps those a phase's placements allow, with the W kept for the step's end under overlapped
steps (`with_fill_tails`). Pure functions of the evaluator; no search state.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from octopipe.partition import OutOfTime
from octopipe.placement import seed_placements
from octopipe.tuner.balance import balanced_ranges
from octopipe.tuner.candidate import Candidate, Evaluator, fill_tails

SEED_WARMUPS = (1.5, 3.0)  # every seed is scheduled with a moderate and a deep warm-up


def seed_candidates(
    evaluator: Evaluator,
    max_chunks: int,
    min_chunks: int = 1,
    deadline: float = math.inf,
    recompute: str = "none",
) -> list[Candidate]:
    """The seeds of each placement; those whose partitions the `deadline` leaves no time for
    are left out (a huge profile's min-max splits take long; the baselines still seed).
    `recompute`: the partitions are balanced for the work of every layer recomputed so."""
    costs, speeds = evaluator.costs, evaluator.speeds
    # With data parallelism, finishing a stage's W early lets its all-reduce hide under the
    # device's remaining backward work; the seeds' variants try the other way too.
    early = evaluator.data_parallel
    seeds = []
    for label, placement in seed_placements(
        evaluator.devices, max_chunks, costs.num_layers, min_chunks, _heavy_last(evaluator)
    ):
        try:
            options = balanced_ranges(costs, placement, speeds, deadline, recompute)
        except OutOfTime:
            break
        seeds += [
            Candidate(ranges, placement, warmup=warmup, reduce_early=early, label=label + tag)
            for tag, ranges in options
            for warmup in SEED_WARMUPS
        ]
    return seeds


# A last layer with at least this share of a device's work (all the work over the devices'
# speeds) is worth a device of its own (a large vocabulary's head: gemma2-9b's is 0.96 at PP 8).
HEAVY_LAST_SHARE = 0.75


def _heavy_last(evaluator: Evaluator) -> bool:
    layers = evaluator.profile.layers
    share = sum(layer.work for layer in layers) / sum(evaluator.speeds)
    return layers[-1].work / max(evaluator.speeds) >= HEAVY_LAST_SHARE * share


def startable(
    evaluator: Evaluator,
    seeds: list[Candidate],
    allowed: Callable[[tuple[int, ...]], bool],
    overlap_steps: bool,
) -> list[Candidate]:
    """The seeds the search may start from, with W kept for the step's end under overlap."""
    seeds = [c for c in seeds if allowed(c.placement)]
    return [with_fill_tails(evaluator, c) for c in seeds] if overlap_steps else seeds


def with_fill_tails(evaluator: Evaluator, cand: Candidate) -> Candidate:
    """The candidate keeping, per device, the W that `fill_tails` guesses for the step's end."""
    tails = fill_tails(evaluator.stages(cand), evaluator.num_devices, evaluator.M)
    return cand.but(tail_w=tails)
