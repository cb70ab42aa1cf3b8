"""Hand-built sample plans for the picture tests (independent of the schedule generators).

No tests here: builders shared by tests/test_viz.py and the sample-picture script
(`python -m tests.viz_samples /tmp/octopipe_viz`).
"""

from __future__ import annotations

import sys
from collections.abc import Container
from pathlib import Path

from octopipe.actions import Action
from octopipe.costs import CostTable
from octopipe.plan import Plan, make_plan
from octopipe.profile import DataParallel, Device, LayerCost, Link, Profile
from tests.sim_helpers import one_f_one_b


def layer_profile(
    num_layers: int,
    devices: int,
    f: float = 1e-3,
    b: float = 1e-3,
    w: float = 1e-3,
    head_scale: float = 1.0,
    speeds: list[float] | None = None,
    memory_bytes: float = float("inf"),
) -> Profile:
    """Uniform layers (ms scale) with an optionally heavier last layer, like a big-vocab head."""
    layers = []
    for i in range(num_layers):
        k = head_scale if i == num_layers - 1 else 1.0
        layers.append(
            LayerCost(
                name=f"layers.{i}",
                f=f * k,
                b=b * k,
                w=w * k,
                act_bytes=64 << 20,
                wact_bytes=16 << 20,
                param_bytes=512 << 20,
                out_bytes=8 << 20,
            )
        )
    speeds = speeds or [1.0] * devices
    devs = tuple(Device(speed=s, memory_bytes=memory_bytes) for s in speeds)
    return Profile(
        name="sample", layers=tuple(layers), devices=devs, link=Link(bandwidth=50e9, latency=1e-5)
    )


def data_parallel(
    profile: Profile, degree: int = 4, grad_layers: Container[int] | None = None
) -> Profile:
    """`profile` in `degree` replicas whose layers (all, or those in `grad_layers`) reduce their
    parameters' bytes of gradients, so their stages get all-reduces."""
    reduced = range(len(profile.layers)) if grad_layers is None else grad_layers
    layers = tuple(
        layer.model_copy(update={"grad_bytes": layer.param_bytes if i in reduced else 0})
        for i, layer in enumerate(profile.layers)
    )
    dp = DataParallel(degree=degree, bandwidth=50e9, latency=1e-5)
    return profile.model_copy(update={"layers": layers, "data_parallel": dp})


def interleaved_1f1b(num_devices: int, chunks: int, num_microbatches: int) -> Plan:
    """Megatron's interleaved 1F1B: stage v*P + d on device d; M a multiple of P."""
    P, V, M = num_devices, chunks, num_microbatches
    assert M % P == 0, "interleaved 1F1B groups microbatches by the device count"
    total = M * V

    def forward(k: int, d: int) -> Action:
        v = (k // P) % V
        return Action(v * P + d, "F", (k // (P * V)) * P + k % P)

    def backward(k: int, d: int) -> Action:
        v = V - 1 - (k // P) % V
        return Action(v * P + d, "B", (k // (P * V)) * P + k % P)

    orders = {}
    for d in range(P):
        warm = min(total, (P - d - 1) * 2 + (V - 1) * P)
        acts = [forward(k, d) for k in range(warm)]
        for k in range(total - warm):
            acts += [forward(warm + k, d), backward(k, d)]
        acts += [backward(k, d) for k in range(total - warm, total)]
        orders[d] = acts
    ranges = [(s, s + 1) for s in range(P * V)]
    return make_plan(P, M, ranges, [s % P for s in range(P * V)], orders)


def v_shape_greedy(
    profile: Profile, num_devices: int, num_microbatches: int, max_in_flight: int | None = None
) -> Plan:
    """V placement (stage s on device s, then back: 2P-1-s) with split backward, ordered by a
    small greedy list scheduler: earliest start first; on ties I before F before W, and W only
    fills time nothing else can use. One layer per stage."""
    P, M = num_devices, num_microbatches
    S = 2 * P
    place = [s if s < P else S - 1 - s for s in range(S)]
    costs = CostTable(profile)
    speed = [dev.speed for dev in profile.device_list(P)]
    dur = {}
    for s in range(S):
        f, b, w = costs.stage_times(s, s + 1)
        dur[s] = {"F": f / speed[place[s]], "I": b / speed[place[s]], "W": w / speed[place[s]]}
    cap = max_in_flight or 2 * P  # microbatches a stage holds between its F and its W
    end: dict[Action, float] = {}
    free = [0.0] * P
    in_flight = [0] * S
    pending = {
        d: [Action(s, k, m) for s in range(S) if place[s] == d for m in range(M) for k in "FIW"]
        for d in range(P)
    }
    orders: dict[int, list[Action]] = {d: [] for d in range(P)}
    priority = {"I": 0, "F": 1, "W": 2}

    def ready_at(a: Action) -> float | None:
        deps = []
        if a.kind == "F" and a.stage > 0:
            deps.append(Action(a.stage - 1, "F", a.mb))
        if a.kind == "I":
            deps.append(Action(a.stage, "F", a.mb))
            if a.stage < S - 1:
                deps.append(Action(a.stage + 1, "I", a.mb))
        if a.kind == "W":
            deps.append(Action(a.stage, "I", a.mb))
        if any(x not in end for x in deps):
            return None
        return max((end[x] for x in deps), default=0.0)

    while any(pending.values()):
        best = None
        for d in range(P):
            for a in pending[d]:
                if a.kind == "F" and in_flight[a.stage] >= cap:
                    continue
                r = ready_at(a)
                if r is None:
                    continue
                key = (max(free[d], r), priority[a.kind], a.mb, a.stage)
                if best is None or key < best[0]:
                    best = (key, d, a)
        assert best is not None, "greedy scheduler stuck"
        (start, *_), d, a = best
        end[a] = start + dur[a.stage][a.kind]
        free[d] = end[a]
        in_flight[a.stage] += {"F": 1, "I": 0, "W": -1}[a.kind]
        pending[d].remove(a)
        orders[d].append(a)
    return make_plan(P, M, [(s, s + 1) for s in range(S)], place, orders)


def write_samples(folder: str | Path) -> list[Path]:
    """Write the sample pictures and traces the report points to."""
    from octopipe import viz
    from octopipe.sim import Simulator
    from octopipe.trace import write_trace

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    cases = {
        "1f1b_4x8": (layer_profile(4, 4, head_scale=1.6), one_f_one_b(4, 8)),
        "1f1b_split_4x8": (layer_profile(4, 4), one_f_one_b(4, 8, split=True)),
        "interleaved_4x2x8": (layer_profile(8, 4), interleaved_1f1b(4, 2, 8)),
        "vshape_hetero_4x8": None,
        "1f1b_dp_4x8": (data_parallel(layer_profile(4, 4)), one_f_one_b(4, 8)),
        "vshape_dp_4x8": None,
        "1f1b_32x128": (layer_profile(32, 32), one_f_one_b(32, 128)),
        "1f1b_split_32x128": (layer_profile(32, 32), one_f_one_b(32, 128, split=True)),
    }
    hetero = layer_profile(8, 4, speeds=[1.0, 1.0, 0.8, 1.25], memory_bytes=12 << 30)
    cases["vshape_hetero_4x8"] = (hetero, v_shape_greedy(hetero, 4, 8, max_in_flight=6))
    cases["vshape_dp_4x8"] = (data_parallel(hetero), cases["vshape_hetero_4x8"][1])
    for name, (profile, plan) in cases.items():
        result = Simulator(profile).run(plan)
        written.append(viz.save_timeline(result, out / f"{name}.png", title=name))
        written.append(viz.save_html_timeline(result, out / f"{name}.html", title=name))
        if plan.num_devices <= 8:
            written.append(viz.save_timeline(result, out / f"{name}.svg", title=name))
            written.append(
                viz.save_memory_plot(result, plan, profile, out / f"{name}_memory.png", title=name)
            )
        written.append(write_trace(out / f"{name}.trace.json", result.events, "simulated"))
    return written


if __name__ == "__main__":
    for p in write_samples(sys.argv[1] if len(sys.argv) > 1 else "/tmp/octopipe_viz"):
        print(p)
