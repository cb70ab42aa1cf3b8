"""Small plan and profile builders for the simulator's tests (independent of the generators)."""

from __future__ import annotations

import random

from octopipe.actions import Action
from octopipe.plan import Plan, make_plan
from octopipe.profile import (
    DataParallel,
    Device,
    LayerCost,
    Link,
    Profile,
    Recomputation,
    Recomputed,
)


def uniform_profile(
    num_layers: int,
    f=1.0,
    b=1.0,
    w=1.0,
    act=10,
    wact=4,
    param=100,
    out=1,
    devices: int | None = None,
    link: Link | None = None,
) -> Profile:
    layers = [
        LayerCost(
            name=f"layers.{i}",
            f=f,
            b=b,
            w=w,
            act_bytes=act,
            wact_bytes=wact,
            param_bytes=param,
            out_bytes=out,
        )
        for i in range(num_layers)
    ]
    devs = tuple(Device() for _ in range(devices)) if devices else None
    return Profile(name="uniform", layers=tuple(layers), devices=devs, link=link or Link())


def one_f_one_b(num_devices: int, num_microbatches: int, split: bool = False) -> Plan:
    """1F1B on one stage per device, one layer per stage; I+W back to back when `split`."""
    P, M = num_devices, num_microbatches
    orders = {}
    for d in range(P):
        warm = min(P - d - 1, M)
        acts = [Action(d, "F", m) for m in range(warm)]
        f = warm
        for m in range(M):
            if f < M:
                acts.append(Action(d, "F", f))
                f += 1
            acts += [Action(d, "I", m), Action(d, "W", m)] if split else [Action(d, "B", m)]
        orders[d] = acts
    return make_plan(P, M, [(i, i + 1) for i in range(P)], list(range(P)), orders)


def random_profile(
    rng: random.Random,
    layers: int,
    devices: int,
    *,
    memory: bool = False,
    data_parallel: bool = False,
    recompute: bool = False,
    blocking: bool = False,
) -> Profile:
    """A small heterogeneous profile: layers of any cost (a fifth of them heavy, as a
    vocabulary head or a vision tower is), devices of any speed, a slow link; and where asked
    what else the simulator prices: a tight memory, data parallelism, recomputation, blocking
    transfers (tests/test_bounds.py, tests/test_exact.py)."""
    costs = []
    for i in range(layers):
        heavy = rng.random() < 0.2  # a vocabulary head, a vision tower, a Mamba block
        scale = rng.uniform(3, 8) if heavy else 1.0
        act = rng.randint(5, 20)
        redo = None
        if recompute:
            redo = Recomputation(
                selective=Recomputed(
                    b=scale * rng.uniform(0.5, 2.5),
                    act_bytes=rng.randint(1, act),
                    wact_bytes=rng.randint(act, 2 * act),
                )
            )
        costs.append(
            LayerCost(
                name=f"layers.{i}",
                f=scale * rng.uniform(0.2, 1.0),
                b=scale * rng.uniform(0.2, 2.0),
                w=scale * rng.uniform(0.0, 1.0),
                act_bytes=act,
                wact_bytes=rng.randint(0, act),
                param_bytes=0,
                out_bytes=rng.randint(1, 10**6),
                grad_bytes=rng.randint(0, 10**6) if data_parallel else 0,
                recompute=redo,
            )
        )
    dp = DataParallel()
    if data_parallel:
        dp = DataParallel(
            degree=rng.choice((2, 4)),
            bandwidth=rng.choice((1e6, 1e7)),
            latency=rng.uniform(0, 0.1),
            bucket_bytes=rng.choice((None, 200_000, 500_000)),
            at_end=rng.random() < 0.3,
            sharded=rng.random() < 0.3,
        )
    return Profile(
        name="random",
        layers=tuple(costs),
        devices=tuple(
            Device(
                speed=rng.choice((0.5, 1.0, 1.0, 2.0)),
                memory_bytes=rng.randint(10, 30) if memory else float("inf"),
            )
            for _ in range(devices)
        ),
        link=Link(latency=rng.uniform(0, 0.05), bandwidth=rng.choice((1e6, 1e7, 1e9))),
        data_parallel=dp,
        blocking_transfers=blocking,
    )
