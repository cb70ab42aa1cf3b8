"""Stage-to-rank map for torchtitan 0.3.x, read from an OctoPipe schedule CSV.

`octopipe plan` copies this file, unchanged, beside the plan as `octopipe_torchtitan_stages.py`;
`octopipe_torchtitan.py` installs it when the plan's placement is one torchtitan cannot build.

What it replaces and why: torchtitan decides which stages a pipeline rank builds in one function,
`torchtitan.distributed.pipeline_parallel._get_pp_rank_to_stage_indices_mapping(pp_rank,
pp_degree, pp_schedule, num_stages)`. It knows two maps, the loop (stage s on rank s % P) and,
for the V schedules, the V (two stages per rank), and asserts num_stages % P == 0; any other
plan fails that assertion, or builds stages on ranks whose CSV rows do not run them and
deadlocks. `install` replaces that function with one that returns, for each rank, the stages
its row of the CSV runs (the map torch's `_PipelineScheduleRuntime` infers from the same file).
Nothing else in torchtitan changes: it still splits the model, builds the schedule from the CSV
and trains.

Only the standard library at import (this file must import in any Python); torchtitan is
imported by `install`.
"""

from __future__ import annotations

import csv
import re
from types import ModuleType

REPLACED = "_get_pp_rank_to_stage_indices_mapping"
_STAGE = re.compile(r"(\d+)[FBIW]\d+")  # every action's stage, composite entries included


def stage_ranks(csv_path: str) -> dict[int, int]:
    """Stage index -> the rank (CSV row) that runs it. A stage on two rows, or stages that
    are not 0 .. S-1, is a ValueError naming the file."""
    with open(csv_path, newline="") as fh:
        rows = list(csv.reader(fh))
    ranks: dict[int, int] = {}
    for rank, row in enumerate(rows):
        for cell in row:
            for stage in map(int, _STAGE.findall(cell)):
                if ranks.setdefault(stage, rank) != rank:
                    raise ValueError(
                        f"{csv_path}: stage {stage} has actions on rank {ranks[stage]} and rank "
                        f"{rank}; a stage lives on one rank"
                    )
    if not ranks:
        raise ValueError(f"{csv_path}: no actions")
    missing = [s for s in range(max(ranks) + 1) if s not in ranks]
    if missing:
        raise ValueError(f"{csv_path}: no rank runs stage {missing[0]}")
    return ranks


def stages_of_rank(ranks: dict[int, int], pp_rank: int, pp_degree: int, num_stages: int):
    """The stages `pp_rank` builds, in stage order; a CSV made for another stage count or
    pipeline degree is a ValueError (torchtitan would otherwise build the wrong model parts)."""
    if len(ranks) != num_stages:
        raise ValueError(
            f"the schedule CSV has {len(ranks)} stages, torchtitan's module_fqns_per_model_part "
            f"{num_stages}"
        )
    if max(ranks.values()) >= pp_degree:
        raise ValueError(
            f"the schedule CSV uses rank {max(ranks.values())}, beyond pipeline_parallel_degree "
            f"{pp_degree}"
        )
    return tuple(s for s in sorted(ranks) if ranks[s] == pp_rank)


def install(csv_path: str, pipeline_parallel: ModuleType | None = None) -> None:
    """Make torchtitan (its `pipeline_parallel` module, by default the installed one) place the
    stages as the CSV at `csv_path` does. Idempotent; the file is read once, here."""
    if pipeline_parallel is None:
        from torchtitan.distributed import pipeline_parallel
    if not hasattr(pipeline_parallel, REPLACED):
        raise RuntimeError(
            f"{pipeline_parallel.__name__} has no {REPLACED}: this override is for torchtitan "
            "0.3.x, which chooses each rank's stages there"
        )
    ranks = stage_ranks(csv_path)

    def mapping(pp_rank: int, pp_degree: int, pp_schedule: str, num_stages: int):
        # pp_schedule chose torchtitan's loop or V; the CSV's map replaces both.
        return stages_of_rank(ranks, pp_rank, pp_degree, num_stages)

    mapping.octopipe_schedule_csv = csv_path  # type: ignore[attr-defined]  # says who placed
    setattr(pipeline_parallel, REPLACED, mapping)
