"""bench_executor.py's Markdown: the first pass's table and figures, our executor's trace of the
tuned plan per rank, and the second pass's table."""

from __future__ import annotations

from executor_runs import DEVICES, MODELS, Row, SecondPass
from executor_trace import breakdown, in_run_profile, stage_kind

from octopipe.calibrate import profiled_duration
from octopipe.plan import Plan
from octopipe.profile import Profile
from octopipe.sim import Simulator


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def compute_ratio(profile: Profile, row: Row) -> float:
    """Our executor's compute time in the run over the profile's (steps after the first)."""
    assert row.plan is not None
    recs = [r for rank in row.records for r in rank if r.step > 0]
    run = sum(r.end - r.start for r in recs)
    return run / sum(profiled_duration(profile, row.plan, *stage_kind(r)) for r in recs)


def report(
    model: str, profile: Profile, tuned: Plan, rows: list[Row]
) -> tuple[list[str], dict[str, float]]:
    size = MODELS[model]
    work = sum(x.work for x in profile.layers)
    lines = [
        (
            f"### {model} (seq-len {size.seq_len}, micro-batch-size {size.micro_batch_size}, "
            f"{tuned.num_microbatches} microbatches, {DEVICES} ranks x 1 thread)"
        ),
        "",
        (
            f"Profile: {ms(work)} ms of F+B+W per microbatch; tuned plan: "
            f"{tuned.num_stages} stages on devices {list(tuned.placement)}."
        ),
        "",
        (
            "| plan | runner | simulated ms | measured ms: fastest run | median | slowest "
            "| fastest / simulated | op time in run / profile | simulated from in-run op times |"
        ),
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        extra = "| | |"
        if r.records and r.plan is not None:
            in_run = (
                Simulator(in_run_profile(profile, r.plan, r.records)).run(r.plan).iteration_time
            )
            error = r.fastest / in_run - 1
            extra = f"| {compute_ratio(profile, r):.3f} | {ms(in_run)} ({error:+.1%}) |"
        lines.append(
            f"| {r.plan_label} | {r.runner} | {ms(r.simulated)} | {ms(r.fastest)} | "
            f"{ms(r.median)} | {ms(r.slowest)} | {r.fastest / r.simulated:.3f} {extra}"
        )
    ours_tuned, csv = rows[0], rows[1]
    best_torch = min(
        (r for r in rows if r.runner.startswith("PyTorch Schedule")), key=lambda r: r.fastest
    )
    figures = {
        "sim_error": ours_tuned.fastest / ours_tuned.simulated - 1,
        "sim_error_median": ours_tuned.median / ours_tuned.simulated - 1,
        "vs_best_torch": best_torch.fastest / ours_tuned.fastest,
        "vs_best_torch_median": best_torch.median / ours_tuned.median,
        "vs_csv_runtime": csv.fastest / ours_tuned.fastest,
        "vs_csv_runtime_median": csv.median / ours_tuned.median,
    }
    lines += [
        "",
        (
            "- tuned plan, our executor vs the simulator (measured profile): "
            f"{figures['sim_error']:+.1%} (fastest run), "
            f"{figures['sim_error_median']:+.1%} (median)"
        ),
        (
            "- the best PyTorch schedule's time over the tuned plan's on our executor "
            f"({best_torch.runner.removeprefix('PyTorch ')}): {figures['vs_best_torch']:.3f}x "
            f"(fastest runs), {figures['vs_best_torch_median']:.3f}x (medians)"
        ),
        (
            "- the same schedule.csv, `_PipelineScheduleRuntime` time over our executor's: "
            f"{figures['vs_csv_runtime']:.3f}x (fastest runs), "
            f"{figures['vs_csv_runtime_median']:.3f}x (medians)"
        ),
        "",
        (
            "Our executor's trace of the tuned plan (its fastest run; per step, median over the "
            "steps after the first; step = the slowest rank's):"
        ),
        "",
        (
            "| rank | step ms | compute ms (in run) | compute ms (profile) | in run / profile "
            "| wait ms | gaps ms | outside actions ms |"
        ),
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for rank, recs in enumerate(ours_tuned.records):
        if not recs:
            continue
        b = breakdown(profile, tuned, recs, ours_tuned.step_times)
        lines.append(
            f"| {rank} | {ms(b.step)} | {ms(b.compute)} | {ms(b.compute_profiled)} | "
            f"{b.compute / b.compute_profiled:.3f} | {ms(b.wait)} | {ms(b.gaps)} | {ms(b.tail)} |"
        )
    return lines, figures


def second_pass_lines(second: SecondPass) -> list[str]:
    ours, theirs, fit = second.ours, second.theirs, second.fit
    assert ours.plan is not None
    other = theirs.runner.removeprefix("PyTorch ")
    return [
        (
            f"Second pass (`octopipe calibrate` on the tuned plan's fastest run): in run = "
            f"{fit.scale:.3f} x profile + {fit.overhead * 1e6:.0f} us per action "
            f"({fit.points} stage/kind pairs); `octopipe plan` on the profile x {fit.scale:.3f} "
            f"with `--action-overhead` chose {ours.plan.num_stages} stages on devices "
            f"{list(ours.plan.placement)}, run taking turns with {other}."
        ),
        "",
        (
            "| plan | runner | simulated ms | measured ms: fastest run | median | slowest "
            "| fastest / simulated |"
        ),
        "|---|---|---:|---:|---:|---:|---:|",
        *(
            f"| {r.plan_label} | {r.runner} | {ms(r.simulated)} | {ms(r.fastest)} | "
            f"{ms(r.median)} | {ms(r.slowest)} | {r.fastest / r.simulated:.3f} |"
            for r in (ours, theirs)
        ),
        "",
        (
            "- second-pass plan vs the simulator on the calibrated profile (its `predicted`, "
            f"default semantics): {ours.fastest / ours.simulated - 1:+.1%} (fastest run), "
            f"{ours.median / ours.simulated - 1:+.1%} (median); on the profile as measured "
            f"({ms(second.simulated_from_measured)} ms): "
            f"{ours.fastest / second.simulated_from_measured - 1:+.1%}; on the calibrated "
            f"profile with the overhead ({ms(second.simulated_with_overhead)} ms): "
            f"{ours.fastest / second.simulated_with_overhead - 1:+.1%} (fastest runs)"
        ),
        (
            f"- {other}'s time over the second-pass plan's: "
            f"{theirs.fastest / ours.fastest:.3f}x (fastest runs), "
            f"{theirs.median / ours.median:.3f}x (medians)"
        ),
    ]
