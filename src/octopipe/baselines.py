"""Baseline plans: a named schedule with a named partitioner, predicted by the simulator.

    make_baseline(profile, "i1f1b", "uniform", num_devices=4, num_microbatches=8) -> Plan
    all_baselines(profile, 4, 8) -> [("gpipe/uniform", Plan), ...]

These are the plans people run today (Megatron-LM, torchtitan, the zero-bubble schedules,
DualPipeV); the tuner must beat them. This module only combines `schedules` and `partition`.
"""

from __future__ import annotations

import math
import time

from octopipe.errors import InputError
from octopipe.partition import METHODS, OutOfTime
from octopipe.partition import partition as split_layers
from octopipe.plan import Plan, make_plan
from octopipe.profile import Profile
from octopipe.schedules import SCHEDULES, ScheduleSpec, generate
from octopipe.sim import Simulator


def make_baseline(
    profile: Profile,
    schedule: str,
    partition: str,
    num_devices: int,
    num_microbatches: int,
    chunks: int | None = None,
    simulator: Simulator | None = None,
    deadline: float = math.inf,
) -> Plan:
    """The plan of `schedule` over the stages the `partition` method cuts, with `predicted` filled.

    The balanced partitioner sees the schedule's placement, so a fast device gets more layers.
    """
    profile.device_list(num_devices)  # a device count the profile cannot serve is an input error
    spec = generate(schedule, num_devices, num_microbatches, chunks)
    plan = baseline_plan(profile, spec, partition, num_microbatches, deadline)
    result = (simulator or Simulator(profile)).run(plan, detail=False, check=False)
    return plan.with_predicted(result.predicted())


def baseline_plan(
    profile: Profile,
    spec: ScheduleSpec,
    partition: str,
    num_microbatches: int,
    deadline: float = math.inf,
) -> Plan:
    """A generated schedule's plan over the stages the `partition` method cuts, not simulated
    (for callers that simulate it their own way; `spec` from `schedules.generate`)."""
    ranges = split_layers(profile, spec.num_stages, partition, spec.placement, deadline)
    plan = make_plan(spec.num_devices, num_microbatches, ranges, spec.placement, spec.orders)
    return plan.with_layer_names(profile.layer_names).made_for(profile)


def all_baselines(
    profile: Profile, num_devices: int, num_microbatches: int, time_limit: float = math.inf
) -> list[tuple[str, Plan]]:
    """Every schedule (default chunks) with every partitioner, labelled "schedule/partition";
    combinations the counts do not support (too few microbatches or layers) are skipped.
    After `time_limit` seconds no further baseline is built, and one being partitioned is
    abandoned (the first, uniform, always is built)."""
    profile.device_list(num_devices)  # wrong device count: an error, not an empty list
    simulator = Simulator(profile)
    started = time.perf_counter()
    out: list[tuple[str, Plan]] = []
    for schedule in SCHEDULES:
        for method in METHODS:
            if out and time.perf_counter() - started > time_limit:
                return out
            try:
                plan = make_baseline(
                    profile,
                    schedule,
                    method,
                    num_devices,
                    num_microbatches,
                    simulator=simulator,
                    deadline=started + time_limit if out else math.inf,
                )
            except InputError:
                continue
            except OutOfTime:
                return out
            out.append((f"{schedule}/{method}", plan))
    return out
