"""Random valid plans: random partitions, placements and dependency-respecting orders.

For property tests of the simulator and fuzzing of the executor. A plan is drawn as a random
topological order of the whole dependency graph, projected onto each device, so it can never
deadlock; B and split I/W are mixed per (stage, microbatch).
"""

from __future__ import annotations

import random

from octopipe.plan import Action, Plan, make_plan


def random_plan(
    rng: random.Random,
    num_layers: int,
    num_devices: int,
    num_microbatches: int,
    max_stages: int | None = None,
    split_probability: float = 0.5,
) -> Plan:
    """A random valid plan over `num_layers` layers (needs num_layers >= 1)."""
    most = min(num_layers, max_stages or num_layers)
    S = rng.randint(1, most)
    cuts = sorted(rng.sample(range(1, num_layers), S - 1))
    bounds = [0, *cuts, num_layers]
    ranges = list(zip(bounds[:-1], bounds[1:]))
    placement = [rng.randrange(num_devices) for _ in range(S)]
    split = {(s, m): rng.random() < split_probability for s in range(S) for m in range(num_microbatches)}
    order = random_topological_order(rng, S, num_microbatches, split)
    orders: dict[int, list[Action]] = {d: [] for d in range(num_devices)}
    for a in order:
        orders[placement[a.stage]].append(a)
    return make_plan(num_devices, num_microbatches, ranges, placement, orders)


def random_topological_order(
    rng: random.Random, num_stages: int, num_microbatches: int, split: dict[tuple[int, int], bool]
) -> list[Action]:
    """All actions of a pipeline in a random order that respects every dependency."""
    S, M = num_stages, num_microbatches
    done: set[tuple[int, str, int]] = set()

    def bwd_done(s: int, m: int) -> bool:
        return (s, "I", m) in done or (s, "B", m) in done

    def ready(s: int, k: str, m: int) -> bool:
        if k == "F":
            return s == 0 or (s - 1, "F", m) in done
        if k == "W":
            return (s, "I", m) in done
        return (s, "F", m) in done and (s == S - 1 or bwd_done(s + 1, m))

    todo = []
    for s in range(S):
        for m in range(M):
            todo.append((s, "F", m))
            todo += [(s, "I", m), (s, "W", m)] if split[(s, m)] else [(s, "B", m)]
    order = []
    while todo:
        candidates = [i for i, a in enumerate(todo) if ready(*a)]
        pick = todo.pop(rng.choice(candidates))
        done.add(pick)
        order.append(Action(*pick))
    return order
