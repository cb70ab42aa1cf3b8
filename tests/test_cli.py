"""The `octopipe` command as a user meets it: light commands stay light, help shows defaults."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from octopipe.cli import build_parser, main

PROBE = """
import json, sys
from octopipe.cli import main
code = main(json.loads(sys.argv[1]))
print(json.dumps([code, sorted(m for m in ('torch', 'matplotlib') if m in sys.modules)]))
"""


def _run_in_fresh_process(argv: list[str]) -> tuple[int, list[str]]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(argv)], capture_output=True, text=True, timeout=120
    )
    code, heavy = json.loads(out.stdout.strip().splitlines()[-1])
    return code, heavy


def test_light_commands_import_neither_torch_nor_matplotlib(tmp_path):
    profile, plan = str(tmp_path / "p.json"), str(tmp_path / "b.json")
    steps = [
        ["profile-arch", "tiny-llama", "--devices", "2", "-o", profile],
        ["baseline", "--profile", profile, "--schedule", "zbv", "--partition", "balanced"]
        + ["--microbatches", "4", "-o", plan],
        ["simulate", "--profile", profile, "--plan", plan, "--json"],
        ["plan", "--profile", profile, "--microbatches", "4", "--time-budget", "2", "--quiet"]
        + ["--no-png", "-o", str(tmp_path / "out")],
    ]
    for argv in steps:
        assert _run_in_fresh_process(argv) == (0, []), argv
    # Refusing transformers' names for a model `hf:` cannot run takes no torch either.
    refused = ["profile-arch", "nemotron-h-8b", "--layer-names", "hf", "-o", profile]
    assert _run_in_fresh_process(refused) == (2, [])


def test_a_picture_is_the_only_reason_to_load_matplotlib(tmp_path):
    profile, plan = str(tmp_path / "p.json"), str(tmp_path / "b.json")
    assert main(["profile-arch", "tiny-llama", "--devices", "2", "-o", profile]) == 0
    argv = ["baseline", "--profile", profile, "--schedule", "1f1b", "--partition", "uniform"]
    assert main([*argv, "--microbatches", "4", "-o", plan]) == 0
    png = str(tmp_path / "t.png")
    argv = ["simulate", "--profile", profile, "--plan", plan, "--png", png]
    assert _run_in_fresh_process(argv) == (0, ["matplotlib"])


def _option_entries(help_text: str) -> dict[str, str]:
    """Option -> its whole entry in a help text (entries start at a line "  -...")."""
    entries: dict[str, str] = {}
    current = None
    for line in help_text.splitlines():
        if line.startswith("  -"):
            current = line.split()[0].rstrip(",")
            entries[current] = line
        elif line.startswith("    ") and current:
            entries[current] += " " + line.strip()
        else:
            current = None
    return entries


@pytest.mark.parametrize("command", ["plan", "run", "profile", "profile-arch", "simulate"])
def test_help_shows_every_default(command, capsys):
    assert main([command, "--help"]) == 0
    entries = _option_entries(capsys.readouterr().out)
    sub = build_parser()._subparsers._group_actions[0].choices[command]
    shown = 0
    for action in sub._actions:
        default = action.default
        if default is None or isinstance(default, bool) or default == "==SUPPRESS==":
            continue  # a flag, or an option whose absence means something: nothing to show
        if not action.option_strings:
            continue
        entry = next(entries[o] for o in action.option_strings if o in entries)
        assert "(default" in entry, entry
        shown += 1
    assert shown > 0


def test_models_says_what_each_model_is(capsys):
    assert main(["models"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    by_name = {line.split()[0]: line for line in lines}
    assert {"tiny-llama", "tiny-moe", "tiny-hybrid", "tiny-vlm"} <= set(by_name)
    assert "Mamba" in by_name["tiny-hybrid"] and "parameters" in by_name["tiny-llama"]
