"""OctoPipe: pipeline parallelism that co-optimizes partition, placement and scheduling.

The public API (`octopipe/api.py`, shown in the README), loaded on first use so that
`import octopipe` costs neither torch nor matplotlib:

    load_profile, save_profile, load_plan, save_plan, save_schedule_csv   the file formats
    profile_from_config      an analytic profile from an architecture config
    measure_profile          a measured profile of a real model on this machine
    baseline, all_baselines  the named schedules over the named partitions
    simulate                 a plan's time, bubbles and memory
    tune                     the bubble-aware tuner (never worse than a baseline)
    run, JobConfig           train with a plan on torch.distributed, with a job's settings
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "Profile": "octopipe.profile",
    "load_profile": "octopipe.profile",
    "save_profile": "octopipe.profile",
    "Plan": "octopipe.plan",
    "load_plan": "octopipe.plan",
    "save_plan": "octopipe.plan",
    "save_schedule_csv": "octopipe.plan",
    "profile_from_config": "octopipe.api",
    "measure_profile": "octopipe.api",
    "baseline": "octopipe.api",
    "all_baselines": "octopipe.api",
    "simulate": "octopipe.api",
    "tune": "octopipe.api",
    "plan_layout": "octopipe.api",
    "run": "octopipe.training",
    "JobConfig": "octopipe.config",
}
__all__ = [
    "JobConfig",
    "Plan",
    "Profile",
    "all_baselines",
    "baseline",
    "load_plan",
    "load_profile",
    "measure_profile",
    "plan_layout",
    "profile_from_config",
    "run",
    "save_plan",
    "save_profile",
    "save_schedule_csv",
    "simulate",
    "tune",
]

if TYPE_CHECKING:
    from octopipe.api import (
        all_baselines,
        baseline,
        measure_profile,
        profile_from_config,
        simulate,
        tune,
    )
    from octopipe.config import JobConfig
    from octopipe.plan import Plan, load_plan, save_plan, save_schedule_csv
    from octopipe.profile import Profile, load_profile, save_profile
    from octopipe.training import run


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'octopipe' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
