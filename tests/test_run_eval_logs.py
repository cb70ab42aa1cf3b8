"""Held-out evaluation, per-step figures, logs and the checkpoints a run keeps.

Pipelined runs on real gloo process groups evaluate held-out batches and report the gradient
norm of every step exactly as single-process training does (`runtime/reference.py`): under a
split-backward interleaved plan and under FSDP2 (`--zero 3`, replicas). The command line
writes TensorBoard event files and a JSONL log holding the step lines' very figures, keeps
only the newest checkpoints, and says what it does, start-up to resume.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from executor_helpers import TOY, greedy, layer_count, one_f_one_b

from octopipe.cli import main
from octopipe.plan import JobShape, save_plan
from octopipe.runtime.data.batches import GivenBatches, SyntheticData, TokenFile
from octopipe.runtime.job.run_config import Evaluating, Job, RunConfig
from octopipe.runtime.launch.launcher import launch
from octopipe.runtime.model.load import load_recipe
from octopipe.runtime.reference import mismatches, train_reference
from octopipe.runtime.step.optim import OptimizerConfig

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]

TEXT = "Pipelines of stages pass activations forward and gradients back.\n" * 400


@pytest.fixture(scope="module")
def token_files(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("text")
    (root / "corpus.txt").write_text(TEXT)
    out = root / "tokens"
    argv = ["prepare-data", "--tokenizer", "byte", "--input", str(root / "corpus.txt")]
    assert main([*argv, "-o", str(out), "--val-fraction", "0.1"]) == 0
    return out


def _toy_val(plan, dp: int, b: int, batches: int) -> GivenBatches:
    synthetic = SyntheticData(load_recipe(TOY).synthetic_sequence, 8, seed=77)
    sequences = dp * plan.num_microbatches * b
    return GivenBatches([synthetic.global_batch(i, sequences) for i in range(batches)])


def test_evaluation_and_gradient_norms_match_single_process_training(token_files):
    steps = 4
    llama = one_f_one_b(2, 4, num_layers=layer_count("tiny-llama"))
    split = greedy([0, 1, 2, 3, 0, 1, 2, 3], 3, 4, backward=lambda s, m: "I")
    jobs = [
        Job(  # FSDP2 over two replicas: the evaluation's forwards gather, then reshard
            llama,
            RunConfig(
                "tiny-llama",
                seed=3,
                steps=steps,
                optimizer=OptimizerConfig("adamw", lr=3e-3, clip_norm=0.5),
                collect_state=True,
                seq_len=16,
                data=TokenFile(token_files / "train.bin", 16, 3),
                shape=JobShape(tp=1, pp=1, dp=2, microbatch_size=2, zero=3),
                evaluation=Evaluating(
                    data=TokenFile(token_files / "val.bin", 16, 3, flag="--val-data"),
                    every=2,
                    batches=2,
                ),
            ),
        ),
        Job(  # an interleaved plan with every backward split in I and W
            split,
            RunConfig(
                TOY,
                seed=5,
                steps=steps,
                optimizer=OptimizerConfig("sgd", lr=0.05, momentum=0.9),
                collect_state=True,
                evaluation=Evaluating(data=_toy_val(split, 1, 2, 3), every=3, batches=3),
            ),
        ),
    ]
    results = launch(jobs, 4, "gloo", timeout_s=120)
    for job, result in zip(jobs, results):
        reference = train_reference(job.config, job.plan.num_microbatches)
        assert mismatches(result, reference) == []
        summary = result.summary()
        assert summary["grad_norms"] == pytest.approx(reference.grad_norms, rel=1e-5)
        got = [(e["step"], e["val_loss"]) for e in summary["evaluations"]]
        assert [s for s, _ in got] == [k + 1 for k, _ in reference.evaluations]  # its indices
        assert [v for _, v in got] == pytest.approx([v for _, v in reference.evaluations], 1e-5)
        for e in summary["evaluations"]:
            assert e["perplexity"] == pytest.approx(math.exp(e["val_loss"]))
    assert [e["step"] for e in results[0].summary()["evaluations"]] == [2, 4]
    assert [e["step"] for e in results[1].summary()["evaluations"]] == [3, 4]  # and the last
    lrs = results[0].summary()["learning_rates"]
    assert lrs == [jobs[0].config.optimizer.lr_at(k) for k in range(steps)]


def _scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def test_the_command_logs_evaluates_keeps_the_newest_checkpoints_and_resumes(
    token_files, tmp_path, capsys
):
    plan_path = tmp_path / "plan.json"
    save_plan(one_f_one_b(2, 2, num_layers=layer_count("tiny-llama")), plan_path)
    logs, ckpt = tmp_path / "logs", tmp_path / "ckpt"
    argv = ["run", "--plan", str(plan_path), "--model", "tiny-llama", "--seq-len", "16"]
    argv += ["--data", str(token_files / "train.bin"), "--val-data", str(token_files / "val.bin")]
    argv += ["--eval-every", "2", "--eval-batches", "1", "--log-dir", str(logs), "--json"]
    argv += ["--checkpoint-dir", str(ckpt), "--checkpoint-every", "1", "--keep-last", "2"]
    argv += ["--optimizer", "adam", "--lr", "1e-3", "--lr-warmup", "2", "--lr-decay", "constant"]
    argv += ["--peak-tflops", "0.01"]
    assert main([*argv, "--steps", "4"]) == 0
    first = capsys.readouterr()
    lines = [json.loads(x) for x in first.out.splitlines()]
    steps, summary = lines[:-1], lines[-1]
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    assert [s["lr"] for s in steps] == pytest.approx([1e-3 / 3, 2e-3 / 3, 1e-3, 1e-3])
    assert all(s["grad_norm"] > 0 and s["mfu"] > 0 for s in steps)
    for s in steps:  # MFU is the cost model's FLOPs over the step time, ranks and the peak
        rate = summary["model_flops_per_step"] / s["step_time"] / 2
        assert s["mfu"] == pytest.approx(rate / 0.01e12)
    assert ["val_loss" in s for s in steps] == [False, True, False, True]
    err = first.err
    for said in (
        "starting 2 processes",
        "training steps 1 to 4",
        f"saved {ckpt}/step-1 (1 steps done)",
        f"removed {ckpt}/step-2 (--keep-last 2)",
        "step 4/4: loss",
        "step 4: held-out loss",
    ):
        assert said in err, err
    assert sorted(p.name for p in ckpt.iterdir() if p.name.startswith("step-")) == [
        "step-3",
        "step-4",
    ]
    # The JSONL log holds the step lines; TensorBoard's scalars hold their figures.
    logged = [json.loads(x) for x in (logs / "log.jsonl").read_text().splitlines()]
    assert logged == steps
    scalars = _scalars(logs)
    for tag, key in (
        ("train/loss", "loss"),
        ("train/grad_norm", "grad_norm"),
        ("val/loss", "val_loss"),
    ):
        want = [(s["step"], s[key]) for s in steps if key in s]
        assert [k for k, _ in scalars[tag]] == [k for k, _ in want]
        assert [v for _, v in scalars[tag]] == pytest.approx([v for _, v in want], rel=1e-6)
    assert {"train/lr", "train/mfu", "train/tokens_per_second", "memory/peak_bytes"} <= set(scalars)

    # As if the run had stopped after step 4 with its last checkpoint at step 3: step 4 is
    # trained again, and the logs hold it once, as the resumed run trained it.
    shutil.rmtree(ckpt / "step-4")
    assert main([*argv, "--steps", "6", "--resume"]) == 0
    again = capsys.readouterr()
    assert f"resumed from {ckpt}/step-3 (3 steps done)" in again.err
    assert "training steps 4 to 6" in again.err
    resumed = [json.loads(x) for x in again.out.splitlines()[:-1]]
    assert [s["step"] for s in resumed] == [4, 5, 6]
    logged = [json.loads(x) for x in (logs / "log.jsonl").read_text().splitlines()]
    assert logged == steps[:3] + resumed  # the log continues, each step once
    scalars = _scalars(logs)
    assert scalars["train/loss"] == [(s["step"], pytest.approx(s["loss"])) for s in logged]
    assert [k for k, _ in scalars["val/loss"]] == [2, 4, 6]
    assert sorted(p.name for p in ckpt.iterdir() if p.name.startswith("step-")) == [
        "step-5",
        "step-6",
    ]
