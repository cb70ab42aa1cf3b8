"""`octopipe run` refuses, in one line with exit 2 and before any rank starts, what it cannot
run; a loss that turns non-finite stops the run naming the step."""

import json
import re

import pytest
import torch
from executor_helpers import SGD_FLAGS, TOY, gpipe, layer_count, one_f_one_b

from octopipe.cli import main
from octopipe.plan import save_plan


@pytest.fixture
def plan_path(tmp_path):
    path = tmp_path / "plan.json"
    save_plan(one_f_one_b(2, 2, num_layers=layer_count("tiny-llama")), path)
    return path


BAD = [
    (["--nproc", "0"], "argument --nproc: expected an integer from 1 to 1,024, got 0"),
    (["--timeout", "0"], "argument --timeout: expected a number in [1, 1e+06], got 0"),
    (["--timeout", "-5"], "argument --timeout: expected a number in [1, 1e+06], got -5"),
    (["--timeout", "inf"], "argument --timeout: expected a finite number in [1, 1e+06], got inf"),
    (["--lr", "nan"], "argument --lr: expected a finite number in [0, 1e+06], got nan"),
    (["--lr", "inf"], "argument --lr: expected a finite number in [0, 1e+06], got inf"),
    (["--momentum", "-1"], "argument --momentum: expected a number in [0, 1), got -1"),
    (["--momentum", "5"], "argument --momentum: expected a number in [0, 1), got 5"),
    (
        ["--lr", "0.01", "--min-lr", "0.1"],
        "--min-lr: 0.1 is above --lr 0.01: the cosine would rise",
    ),
    (["--dp", "3", "--nproc", "4"], "--dp: 3 replicas do not divide the 4 processes"),
    (["--trace", "/no/such/folder/t.json"], "--trace: folder /no/such/folder does not exist"),
]


@pytest.mark.parametrize("args, message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_settings_it_cannot_use_exit_2_with_one_line(plan_path, capsys, args, message):
    assert main(["run", "--plan", str(plan_path), "--model", "tiny-llama", *args]) == 2
    err = capsys.readouterr().err.strip()
    help_hint = " (see octopipe run --help)" if message.startswith("argument ") else ""
    assert err == f"octopipe run: error: {message}{help_hint}"


def test_an_output_path_that_is_a_folder_is_refused(plan_path, tmp_path, capsys):
    assert main(["run", "--plan", str(plan_path), "--model", "tiny-llama", "--png", str(tmp_path)])
    assert capsys.readouterr().err.strip() == (
        f"octopipe run: error: --png: {tmp_path} is a folder, not a file"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_nccl_without_a_gpu_exits_2_with_one_line(plan_path, capsys):
    argv = ["run", "--plan", str(plan_path), "--model", "tiny-llama", "--backend", "nccl"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "octopipe run: error: --backend: nccl needs a CUDA GPU per rank (2 on this host); "
        "this torch sees 0"
    )


@pytest.mark.slow  # a real process group
@pytest.mark.timeout(120)
def test_a_loss_turned_non_finite_stops_the_run_naming_the_step(tmp_path, capsys):
    save_plan(gpipe(2, 2), tmp_path / "plan.json")
    argv = ["run", "--plan", str(tmp_path / "plan.json"), "--model", TOY, "--steps", "5"]
    argv += SGD_FLAGS  # plain SGD: Adam's normalized steps would not blow up as surely
    # The largest learning rate accepted (1e6) blows the weights up within a few updates.
    assert main([*argv, "--lr", "1e6", "--json"]) == 1
    captured = capsys.readouterr()
    last = captured.err.strip().splitlines()[-1]
    match = re.fullmatch(
        r"octopipe run: the loss became (inf|nan) at step (\d); training stopped", last
    )
    assert match, last
    assert "Traceback" not in captured.err
    steps = [json.loads(line)["step"] for line in captured.out.splitlines()]
    assert steps == list(range(1, int(match.group(2))))  # every step before it, none after
