"""What `plan_cluster` answers (`search.py`): every layout planned, best first, the rows an
answer is set beside, the search's counts and seconds, and (`api.plan_layout` with an output
folder) what was written for the answer. Only the record: no searching.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from octopipe.engines import DEFAULT_ENGINE
from octopipe.engines.files import Written
from octopipe.layouts.layout import Job
from octopipe.layouts.planner import Row


@dataclass(frozen=True)
class LayoutReport:
    job: Job
    rows: tuple[Row, ...]  # every layout planned, best first (the tuned ones as tuned)
    reference: Row | None  # Megatron-LM's usual layout, planned as Megatron-LM runs it
    screened: int  # layouts screened (the references besides)
    candidates: int  # layouts of the search space
    tuned: int
    seconds: float
    given: Row | None = None  # the user's --from-layout, planned as `estimate` plans it
    unfit: int = 0  # layouts set aside: their memory bound exceeds the GPUs'
    pruned: int = 0  # layouts never screened: their step bound could not beat the answer
    skipped: int = 0  # layouts left as a heavier recomputation of one that fits (slower)
    # Layouts of the space screened (`screened` counts the references' outside it too): unfit
    # + screened_in_space + skipped + pruned = candidates.
    screened_in_space: int = 0
    evaluations: int = 0  # layouts screened x their baselines, plus the tuner's evaluations
    cut_by_time: bool = False  # the time budget cut the search: the answer is machine-bound
    notes: tuple[str, ...] = field(default=())
    best_standard: Row | None = None  # the fastest standard schedule, uniform partition
    recipe: Row | None = None  # the model's published recipe, as its framework runs it
    recipe_source: str = ""  # where that recipe is published, at what GPU count
    runner: str = DEFAULT_ENGINE  # the engine every row is for (`octopipe.engines`)
    not_runnable: tuple[tuple[str, str], ...] = ()
    """(reference name, why) for the references the runner cannot run: shown, no candidates."""
    # CPU seconds of each tuning run on the workers, in the order they took them: the finalists
    # and, where its guess was taken, the polish (`fanout.Finalists`)
    tune_cpu: tuple[float, ...] = ()
    workers: int = 1  # processes the finalists were tuned on
    exact: bool = False  # `given` is the answer's layout (`plan --layout`), the only candidate
    written: Written | None = None  # the answer's files and launch lines, where written

    @property
    def best(self) -> Row:
        return self.rows[0]
