"""Random valid plans: random partitions, placements and dependency-respecting orders.

For property tests of the simulator and fuzzing of the executor. A plan is drawn as a random
topological order of the whole dependency graph, dealt out to the devices, so it can never
deadlock; B and split I/W are mixed per (stage, microbatch).
"""

from __future__ import annotations

import itertools
import random

from octopipe.actions import Action, B, F, I, W
from octopipe.plan import Plan, dependencies, make_plan


def random_partition(rng: random.Random, num_layers: int, num_stages: int) -> list[tuple[int, int]]:
    cuts = sorted(rng.sample(range(1, num_layers), num_stages - 1))
    return list(itertools.pairwise([0, *cuts, num_layers]))


def random_plan(
    rng: random.Random,
    num_layers: int,
    num_devices: int,
    num_microbatches: int,
    max_stages: int | None = None,
    split_probability: float = 0.5,
) -> Plan:
    """A random valid plan over `num_layers` layers (needs num_layers >= 1)."""
    num_stages = rng.randint(1, min(num_layers, max_stages or num_layers))
    ranges = random_partition(rng, num_layers, num_stages)
    placement = [rng.randrange(num_devices) for _ in range(num_stages)]
    todo: list[Action] = []
    for s in range(num_stages):
        for m in range(num_microbatches):
            todo.append(Action(s, F, m))
            split = rng.random() < split_probability
            todo += [Action(s, I, m), Action(s, W, m)] if split else [Action(s, B, m)]
    skeleton = make_plan(num_devices, num_microbatches, ranges, placement, {})
    orders: dict[int, list[Action]] = {d: [] for d in range(num_devices)}
    for act in random_topological_order(rng, skeleton, todo):
        orders[placement[act.stage]].append(act)
    return make_plan(num_devices, num_microbatches, ranges, placement, orders)


def random_topological_order(
    rng: random.Random, skeleton: Plan, actions: list[Action]
) -> list[Action]:
    """`actions` in a random order in which every action follows what it depends on."""
    split = frozenset((a.stage, a.mb) for a in actions if a.kind == I)
    waiting = {a: set(dependencies(skeleton, a, split)) for a in actions}
    consumers: dict[Action, list[Action]] = {}
    for a, deps in waiting.items():
        for d in deps:
            consumers.setdefault(d, []).append(a)
    ready = [a for a, deps in waiting.items() if not deps]
    order = []
    while ready:
        act = ready.pop(rng.randrange(len(ready)))
        order.append(act)
        for other in consumers.get(act, ()):
            waiting[other].discard(act)
            if not waiting[other]:
                ready.append(other)
    assert len(order) == len(actions), "dependencies outside the given actions"
    return order
