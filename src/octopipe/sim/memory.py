"""Memory of each device over an iteration, under the simulator's memory semantics.

    traces = memory_over_time(result, plan, profile)   # one MemoryTrace per device
    traces[0].peak_bytes == result.peak_memory_bytes[0]

The deltas are the simulator's own lowering (`graph.build_graph(...).mem_delta`), so the
curve's highest level is the simulated peak for the same order; the events may be simulated
or measured (a measured run's order and times under the profile's memory figures).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from octopipe.actions import Event
from octopipe.costs import CostTable
from octopipe.plan import Plan
from octopipe.profile import Profile
from octopipe.sim.evaluate import SimResult
from octopipe.sim.graph import action_id, build_graph, devices_for
from octopipe.trace import normalized_events


@dataclass(frozen=True)
class MemoryTrace:
    """Memory of one device over an iteration: a step curve (level after each time)."""

    device: int
    times: tuple[float, ...]  # seconds, from the iteration's start
    bytes: tuple[float, ...]  # static + activations held, from that time on
    static_bytes: float
    capacity_bytes: float

    @property
    def peak_bytes(self) -> float:
        return max(self.bytes)


def memory_over_time(
    events: SimResult | Iterable[Event], plan: Plan, profile: Profile
) -> tuple[MemoryTrace, ...]:
    """Per device, the memory level over time under the simulator's memory semantics.

    An action that allocates (F) takes its memory when it starts; one that frees (I, W, B)
    gives it back when it ends. Actions on a device do not overlap, so the curve's highest
    level equals the simulator's peak for the same order.
    """
    graph = build_graph(CostTable(profile), plan, devices_for(profile, plan), check=False)
    M = plan.num_microbatches
    by_device: dict[int, list[Event]] = {d: [] for d in range(plan.num_devices)}
    for e in normalized_events(events.events if isinstance(events, SimResult) else events):
        by_device[e.device].append(e)
    traces = []
    for d in range(plan.num_devices):
        static = float(graph.static_bytes[d])
        times, levels = [0.0], [static]
        level = static
        for e in by_device[d]:
            delta = graph.mem_delta[action_id(e.action, M)]
            if not delta:
                continue
            level += delta
            at = e.start if delta > 0 else e.end
            if at == times[-1]:
                # A free at an action's end and the next action's allocation at the same
                # instant: keep one step. The free comes first, so no peak is lost.
                levels[-1] = level
            else:
                times.append(at)
                levels.append(level)
        traces.append(
            MemoryTrace(
                d, tuple(times), tuple(levels), static, float(graph.devices[d].memory_bytes)
            )
        )
    return tuple(traces)
