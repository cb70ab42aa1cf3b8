"""The README's examples run as written: every code block whose info string names a file
(`python mymodel.py` after the fence) is copied out into one folder as that file, then every
`sh` block runs there, line by line, in the README's order, as a user would paste them (the
`octopipe` command of this environment, the folder as the current one, `NAME=value` words
before a command set in its environment as a shell would; nothing is downloaded). A `texts/`
folder of plain text is the only thing the README asks the user to bring."""

from __future__ import annotations

import os
import random
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs the README's runs: process groups

README = Path(__file__).parent.parent / "README.md"
_BLOCK = re.compile(r"^```(\S*)[ \t]*(\S*)\n(.*?)^```$", re.M | re.S)
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*")


def blocks() -> list[tuple[str, str, str]]:
    """(language, file name or "", text) of every fenced block, in order."""
    return [(m[1], m[2], m[3]) for m in _BLOCK.finditer(README.read_text())]


def commands() -> list[str]:
    """The sh blocks' commands, in order: comments dropped, continued lines joined."""
    lines = []
    for language, _, text in blocks():
        if language == "sh":
            joined = text.replace("\\\n", " ")
            lines += [line for line in joined.splitlines() if line.strip()]
    return lines


def _texts(folder: Path) -> None:
    """A folder of plain text, about 600 kB in 3 files: sentences of a small vocabulary."""
    rng = random.Random(0)
    words = "a pipeline stage device bubble model layer forward backward weight the of and".split()
    folder.mkdir()
    for i in range(3):
        lines = (" ".join(rng.choices(words, k=12)).capitalize() + ".\n" for _ in range(2500))
        (folder / f"part-{i}.txt").write_text("".join(lines))


def test_the_readme_names_its_files_and_commands():
    names = [name for _, name, _ in blocks() if name]
    assert {"mymodel.py", "train.py", "tour.py", "config.json", "generate.py"} <= set(names)
    assert len(names) == len(set(names))
    assert any(c.startswith("octopipe run ") for c in commands())


def test_every_readme_example_runs_as_written(tmp_path):
    for _, name, text in blocks():
        if name:
            (tmp_path / name).write_text(text)
    _texts(tmp_path / "texts")
    bin_dir = Path(sys.executable).parent  # this environment's `octopipe` and `python`
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)  # the folder's own modules must be found without it
    env["HF_HUB_OFFLINE"] = "1"
    printed = {}
    for command in commands():
        argv = shlex.split(command, comments=True)
        assigned = {}
        while argv and _ASSIGNMENT.fullmatch(argv[0]):
            name, value = argv.pop(0).split("=", 1)
            assigned[name] = value
        done = subprocess.run(
            argv, cwd=tmp_path, env={**env, **assigned}, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        printed[command] = done.stdout
    for script in ("python train.py", "python tour.py"):
        assert printed[script].count("losses") == 1, printed[script]
    assert printed["HF_HUB_OFFLINE=1 python generate.py"].startswith("A pipeline")
    assert (tmp_path / "trained" / "tokenizer.json").is_file()
    assert (tmp_path / "logs" / "log.jsonl").is_file() and (tmp_path / "trained").is_dir()


SCRIPT = """
import torch.nn.functional as F
import octopipe as op

def my_loss(outputs, target):
    return F.cross_entropy(outputs[0].flatten(0, 1), target.flatten())

plan = op.baseline(op.profile_from_config("tiny-llama", devices=2), "1f1b", "uniform", 2)
op.run(plan, "tiny-llama", seq_len=8, steps=1, loss=my_loss)
"""


def test_a_script_without_the_guard_is_told_what_to_do(tmp_path):
    """Its loss lives in the script, so the ranks import it, and would run it again."""
    (tmp_path / "unguarded.py").write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, "unguarded.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode != 0
    assert 'put the script\'s work under `if __name__ == "__main__":`' in done.stderr
