"""Small plan and profile builders for the simulator's tests (independent of the generators)."""

from __future__ import annotations

from octopipe.actions import Action
from octopipe.plan import Plan, make_plan
from octopipe.profile import Device, LayerCost, Link, Profile


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
