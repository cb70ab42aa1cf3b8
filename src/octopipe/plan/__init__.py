"""The plan (`octopipe.plan/1`): `data.py` holds the Plan itself (stages, placement, schedule,
written as JSON and CSV); `shape.py` the job's shape (`JobShape`: degrees, rank order, ZeRO,
microbatching, the plan's `parallelism`); `checks.py` reads plan files and checks plans, one
line per fault.

Every public name is re-exported here, so callers import from `octopipe.plan`. Imports nothing
from the simulator, the tuner or the runtime: they all stand on it.
"""

from octopipe.actions import Action
from octopipe.plan.checks import (
    MAX_ZERO_STAGE,
    PARALLELISM_KEYS,
    check_layer_names,
    check_structure,
    load_plan,
    load_schedule_csv,
    load_schedule_entries,
    plan_from_dict,
    warn_if_made_for_another,
)
from octopipe.plan.data import (
    PLAN_FORMAT,
    Composites,
    Plan,
    Stage,
    dependencies,
    flatten_entries,
    make_plan,
    save_plan,
    save_schedule_csv,
    split_backwards,
)
from octopipe.plan.shape import NO_RECOMPUTE, RANK_ORDERS, RECOMPUTE_KINDS, JobShape, Place

__all__ = [
    "MAX_ZERO_STAGE",
    "NO_RECOMPUTE",
    "PARALLELISM_KEYS",
    "PLAN_FORMAT",
    "RECOMPUTE_KINDS",
    "Action",
    "Composites",
    "JobShape",
    "Place",
    "RANK_ORDERS",
    "Plan",
    "Stage",
    "check_layer_names",
    "check_structure",
    "dependencies",
    "flatten_entries",
    "load_plan",
    "load_schedule_csv",
    "load_schedule_entries",
    "make_plan",
    "plan_from_dict",
    "save_plan",
    "save_schedule_csv",
    "split_backwards",
    "warn_if_made_for_another",
]
