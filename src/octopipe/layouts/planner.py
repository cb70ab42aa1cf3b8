"""One layout's plans in the layout search of `octopipe plan --gpus`: a named baseline, the
screening estimate, the tuner on it, and the bounds no plan of the layout can beat.

    search = LayoutSearch(job)                      # the shared cost model (`costs.py`)
    row = search.screen(layout)                     # Row: the best balanced baseline
    row, evaluations, cut = search.tune(row)        # the tuner, seeded with it

A Row's step is the pipeline simulated on every distinct replica (the slowest), then the
optimizer step (`costs.py`). Which layouts are planned, and in what order, is `search.py`'s;
the references an answer is set beside are `reference.py`'s. Both stand on this module.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from octopipe.engines import DEFAULT_ENGINE, Engine, get_engine
from octopipe.errors import InputError
from octopipe.layouts.costs import LayoutCosts, optimizer_seconds
from octopipe.layouts.layout import Job
from octopipe.plan import Plan
from octopipe.plan.shape import JobShape
from octopipe.profile import Profile
from octopipe.schedules import ScheduleSpec, generate, placement_of
from octopipe.sim import SimResult, Simulator
from octopipe.sim.evaluate import plan_rank

# ZB-H1 (1F1B's memory, a third of its bubble) and interleaved 1F1B, both balanced: a layout's
# screening estimate. The tuner then finds better plans for the best few.
SCREEN_BASELINES = (("zbh1", "balanced", None), ("i1f1b", "balanced", None))
# The schedules an engineer runs as they come, over Megatron-LM's uniform partition: the
# `best_standard` row is the fastest of them over every layout screened.
STANDARD_SCHEDULES = (
    ("1f1b", "uniform", None),
    ("i1f1b", "uniform", 2),
    ("zbh1", "uniform", None),
    ("zbv", "uniform", None),
    ("dualpipev", "uniform", None),
)
TUNE_EVALUATIONS = 1500  # the tuner's evaluations per tuned layout, at most
# What one tuning may list-schedule in all: big pipelines get fewer evaluations (each schedules
# stages x microbatches x 3 actions); one that would get fewer than MIN_TUNE_EVALUATIONS keeps
# its screened plan (the tuner's seeds alone take more).
TUNE_ACTIONS = 1_000_000
# Then the layout of the best tuned plan is tuned again from its screening plan, with this many:
# most of the tuner's gain on a big pipeline comes in its first evaluations, the rest on the
# winner.
POLISH_ACTIONS = 4_000_000
FEW_EVALUATIONS = 40
MIN_TUNE_EVALUATIONS = 20
RECENT_PROFILES = 16  # layouts whose profiles are kept


@dataclass(frozen=True)
class Row:
    """One layout's best plan found, simulated on every replica's devices."""

    layout: JobShape
    label: str  # where the plan came from (a baseline's name, "tuned", "Megatron-LM")
    plan: Plan
    profile: Profile  # replica 0's profile, the plan's
    sim: SimResult  # the slowest replica's result
    tail: float = 0.0  # the optimizer step (and ZeRO-1's all-gather) after the pipeline

    @property
    def step_time(self) -> float:
        """The whole step: the pipeline as simulated, then the tail (`layouts/costs.py`)."""
        return self.sim.iteration_time + self.tail

    def tokens_per_gpu(self, job: Job) -> float:
        return job.tokens / self.step_time / job.cluster.size

    @property
    def score(self) -> tuple[int, float, float]:
        return plan_rank(self.step_time, self.sim.memory_excess_bytes)

    @property
    def peak_memory_bytes(self) -> float:
        return max(self.sim.peak_memory_bytes)

    @property
    def memory_lacking_bytes(self) -> float:
        return max(self.sim.memory_excess_bytes)

    def summary(self) -> dict:
        """The row as `plan --gpus --json` puts it on its last line."""
        return {
            **self.layout.degrees(),
            "step_time": self.step_time,
            "peak_memory_bytes": self.peak_memory_bytes,
            "fits": self.sim.fits,
            "plan": self.label,
        }


class LayoutSearch:
    """Plans layouts of one job on the shared cost model (`LayoutCosts`)."""

    def __init__(
        self,
        job: Job,
        overlap_steps: bool = False,
        costs: LayoutCosts | None = None,
        torchtitan: bool = False,
        runner: Engine | None = None,
    ):
        self.runner = runner or get_engine(DEFAULT_ENGINE)  # the engine its plans are for
        if not job.rank_orders:  # none asked for: every order the engine runs
            job = replace(job, rank_orders=self.runner.rank_orders)
        self.job = job = self.runner.price(job)
        self.overlap_steps = overlap_steps  # rank plans by their steady step time
        self.torchtitan = torchtitan  # only placements torchtitan builds itself
        self.costs = costs or LayoutCosts(job)  # shared: profiles are built once
        self._schedules: dict[tuple, ScheduleSpec] = {}  # generated orders, by their counts
        self._recent: dict[JobShape, tuple[Profile, tuple[tuple, ...]]] = {}
        self._simulators: dict[JobShape, list[Simulator]] = {}
        self._base_sums: dict[int, tuple[Profile, tuple[float, float, float]]] = {}

    def synchronous(self) -> LayoutSearch:
        """This search ranking by one synchronous step, sharing the profiles built so far."""
        if not self.overlap_steps:
            return self
        twin = LayoutSearch(
            self.job, costs=self.costs, torchtitan=self.torchtitan, runner=self.runner
        )
        twin._schedules = self._schedules
        return twin

    @property
    def num_layers(self) -> int:
        return self.costs.base_profile(JobShape(1, 1, 1, 1, 1)).num_layers

    def dense_params(self) -> float:
        """The model's parameters, its MoE experts' left out."""
        layers = self.costs.layers(JobShape(1, 1, 1, 1, 1))
        return float(sum(e.params - e.expert_params for e in layers))

    def tp_fits(self, tp: int) -> bool:
        return self.costs.fits_degrees(tp)

    def profile(self, layout: JobShape) -> tuple[Profile, tuple[tuple, ...]]:
        """`LayoutCosts.profile`, kept for the few layouts planned last (a layout's bounds,
        baselines and evaluations each ask for it)."""
        found = self._recent.pop(layout, None)
        if found is None:
            found = self.costs.profile(layout)
            if len(self._recent) >= RECENT_PROFILES:
                del self._recent[next(iter(self._recent))]
        self._recent[layout] = found  # the most recent last
        return found

    # --- evaluating ----------------------------------------------------------------------

    def evaluate(self, layout: JobShape, label: str, plan: Plan) -> Row:
        """The plan on every distinct replica; the row holds the slowest replica's result and
        profile (so the profile it is written with reproduces its figures)."""
        rows = []
        for simulator in self.simulators(layout):
            on = simulator.profile
            # check=False: the plans evaluated here are built by generators and the tuner.
            result = simulator.run(
                plan, detail=False, check=False, overlap_steps=self.overlap_steps
            )
            tail = self.costs.tail(layout, plan, on).total
            rows.append(Row(layout, label, plan, on, result, tail))
        return max(rows, key=lambda r: r.score)

    def simulators(self, layout: JobShape) -> list[Simulator]:
        """A simulator per distinct replica of the layout, kept with its profile (their cost
        tables are built once per layout, not once per plan)."""
        if layout not in self._simulators:
            profile, replicas = self.profile(layout)
            if len(self._simulators) >= RECENT_PROFILES:
                del self._simulators[next(iter(self._simulators))]
            self._simulators[layout] = [Simulator(profile.with_devices(d)) for d in replicas]
        return self._simulators[layout]

    def baseline(self, layout: JobShape, schedule: str, method: str, chunks: int | None) -> Row:
        """One named schedule over one partitioner (InputError when the counts do not allow
        it); the schedule's orders are generated once for every layout of the same counts."""
        from octopipe.baselines import baseline_plan

        key = (schedule, layout.pp, layout.num_microbatches, chunks)
        if key not in self._schedules:
            self._schedules[key] = generate(schedule, *key[1:])
        profile, _ = self.profile(layout)
        plan = baseline_plan(profile, self._schedules[key], method, layout.num_microbatches)
        row = self.evaluate(layout, f"{schedule}/{method}", plan)
        return replace(row, plan=plan.with_predicted(row.sim.predicted()))

    def baselines(
        self, layout: JobShape, names: Iterable[tuple[str, str, int | None]]
    ) -> list[Row]:
        """The named plans the layout's counts allow, of those the runner runs."""
        rows = []
        for schedule, method, chunks in self.runner.schedules(tuple(names), layout):
            try:
                row = self.baseline(layout, schedule, method, chunks)
            except InputError:  # too few microbatches or layers for this schedule
                continue
            if self.runner.refuse_plan(row.plan, layout) is None:
                rows.append(row)
        return rows

    def screen(self, layout: JobShape) -> Row | None:
        """The best of a few balanced baselines: a quick estimate of the layout."""
        names = self.runner.screen_baselines(SCREEN_BASELINES, layout)
        return min(self.baselines(layout, names), key=lambda r: r.score, default=None)

    def standard(self, layout: JobShape, beat: float = float("inf")) -> list[Row]:
        """The standard schedules over the uniform partition that the layout's counts allow,
        each simulated only where its bound (`uniform_bound`) is under `beat`: a schedule
        whose uniform stages hold more work than that on one device cannot step faster."""
        return [row for _, row in self.standard_bounded(layout, beat)]

    def standard_bounded(self, layout: JobShape, beat: float = float("inf")) -> list[tuple]:
        """`standard`'s rows, each with its bound: (bound, Row) pairs, in STANDARD_SCHEDULES'
        order (a caller with a lower `beat` keeps those whose bound is under it)."""
        out = []
        for name in self.runner.standard_schedules(STANDARD_SCHEDULES):
            bound = self.uniform_bound(layout, *name)
            if bound < beat:
                out += [(bound, row) for row in self.baselines(layout, [name])]
        return out

    def tune(
        self,
        start: Row,
        evaluations: int = TUNE_EVALUATIONS,
        time_budget: float = float("inf"),
        seed: int = 0,
        max_chunks: int | None = 4,
        actions: int = TUNE_ACTIONS,
    ) -> tuple[Row, int, bool]:
        """The tuner on `start`'s layout, seeded with `start`'s plan (never worse than it),
        for `evaluations` evaluations (or `time_budget` seconds, whichever ends first); the
        evaluations it made, and whether the seconds ended it. `actions`: what its
        evaluations may list-schedule in all."""
        from octopipe.tuner import tune as search

        layout = start.layout
        profile, _ = self.profile(layout)
        # Each evaluation list-schedules every action of the plan: a bound on the actions.
        per_evaluation = 3 * start.plan.num_stages * layout.num_microbatches
        # A big pipeline gets at least FEW_EVALUATIONS within POLISH_ACTIONS: fewer would leave
        # it untuned (its screened plan), where a few dozen evaluations gain most.
        actions = max(actions, min(POLISH_ACTIONS, FEW_EVALUATIONS * per_evaluation))
        evaluations = min(evaluations, actions // per_evaluation)
        if evaluations < MIN_TUNE_EVALUATIONS or not self.runner.tunes(layout):
            return start, 0, False
        result = search(
            profile,
            layout.num_microbatches,
            layout.pp,
            max_chunks=max_chunks,
            time_budget=time_budget,
            max_evaluations=evaluations,
            seed=seed,
            baselines=[(start.label, start.plan)],
            overlap_steps=self.overlap_steps,
            torchtitan=self.torchtitan,
        )
        row = self.evaluate(layout, "tuned", result.best.plan)
        runs = self.runner.refuse_plan(row.plan, layout) is None
        best = row if runs and row.score <= start.score else start
        return best, result.evaluations, result.cut_by_time

    # --- bounds --------------------------------------------------------------------------

    def step_bound(self, layout: JobShape) -> float:
        """No plan of `layout` steps faster: its work spread evenly over its pipeline devices
        (at the fastest device's speed), then the optimizer update of an even share of the
        parameters."""
        work = self._sums(layout)[0] * layout.num_microbatches
        return work / (layout.pp * self._fastest(layout)) + self._update_bound(layout)

    def _update_bound(self, layout: JobShape) -> float:
        """The optimizer update of an even share of the parameters, on the fastest device."""
        params = sum(e.params for e in self.costs.layers(layout)) / layout.pp
        s = self.costs.settings(layout)
        shards = layout.dp * layout.cp if layout.shards_optimizer else 1
        update = optimizer_seconds(
            params / shards, s.grad_bytes, s.weight_bytes, self.costs.hardware()
        )
        return update / self._fastest(layout)

    def _fastest(self, layout: JobShape) -> float:
        """The fastest pipeline device's speed (1 on a cluster of one kind of GPU)."""
        if not self.job.cluster.mixed:
            return 1.0
        profile, _ = self.profile(layout)
        return max(d.speed for d in profile.device_list())

    def _sums(self, layout: JobShape) -> tuple[float, float, float]:
        """Its layers' work, static bytes and activation bytes, unsharded (the layers before
        topology and ZeRO-1, the same for every DP and PP)."""
        base = self.costs.base_profile(layout)
        found = self._base_sums.get(id(base))
        if found is None:
            layers = base.layers
            sums = (
                sum(layer.work for layer in layers),
                sum(layer.param_bytes for layer in layers),
                sum(layer.act_bytes for layer in layers),
            )
            found = self._base_sums[id(base)] = (base, sums)  # held: its id stays its own
        return found[1]

    def uniform_bound(
        self, layout: JobShape, schedule: str, method: str, chunks: int | None
    ) -> float:
        """No plan of this schedule over this partition steps faster: the microbatches' work on
        its busiest device, then the optimizer update of an even share of the parameters (inf
        where the counts do not allow the schedule)."""
        from octopipe.partition import partition

        try:
            placement = placement_of(schedule, layout.pp, layout.num_microbatches, chunks)
            profile, _ = self.profile(layout)
            ranges = partition(profile, len(placement), method, placement)
        except InputError:
            return float("inf")
        work = [0.0] * layout.pp
        for (start, end), device in zip(ranges, placement):
            work[device] += sum(layer.work for layer in profile.layers[start:end])
        speeds = [d.speed for d in profile.device_list()]
        busiest = max(w / v for w, v in zip(work, speeds))
        return busiest * layout.num_microbatches + self._update_bound(layout)

    def memory_bound(self, layout: JobShape) -> float:
        """No plan of `layout` needs less on its fullest device: an even share of the static
        bytes and of one microbatch's activations."""
        if not layout.shards_optimizer:  # the layers as before topology: no profile needed
            _, static, one = self._sums(layout)
            return (static + one) / layout.pp
        profile, _ = self.profile(layout)
        static = sum(layer.param_bytes for layer in profile.layers)
        one = sum(layer.act_bytes for layer in profile.layers)
        return (static + one) / layout.pp

    def may_fit(self, layout: JobShape) -> bool:
        """Whether `memory_bound` is within `capacity`, without building the profile where
        the unsharded bound already is (ZeRO-1 only lowers the static bytes)."""
        _, static, one = self._sums(layout)
        if (static + one) / layout.pp <= self.capacity():
            return True
        return layout.shards_optimizer and self.memory_bound(layout) <= self.capacity()

    def capacity(self) -> float:
        """What a plan may use of the smallest GPU's memory."""
        smallest = min(g.hardware.memory_bytes for g in self.job.cluster.groups)
        return smallest * (1.0 - self.job.memory_headroom)
