"""A run leaves nothing in the temporary folder: not its own folder, not torch's empty compile
cache folder (which importing torch._dynamo makes, and building a model imports it)."""

import os
import subprocess
import sys

import pytest
from executor_helpers import layer_count, one_f_one_b

from octopipe.plan import save_plan


@pytest.mark.slow  # a real process group, in a fresh interpreter
@pytest.mark.timeout(180)
def test_a_run_leaves_its_temporary_folder_as_it_found_it(tmp_path):
    plan = tmp_path / "plan.json"
    save_plan(one_f_one_b(2, 2, num_layers=layer_count("tiny-llama")), plan)
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env["TMPDIR"] = str(temporary)
    argv = [sys.executable, "-m", "octopipe", "run", "--plan", str(plan), "--model", "tiny-llama"]
    done = subprocess.run([*argv, "--steps", "1"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert list(temporary.iterdir()) == []
