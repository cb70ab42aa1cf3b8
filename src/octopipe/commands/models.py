"""`octopipe models`: the bundled real torch models, one name a line."""

from __future__ import annotations

import argparse

NAME = "models"
HELP = "List the bundled real torch models (usable with `octopipe profile` and `octopipe run`)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    from octopipe.models import bundled_models

    for name in bundled_models():
        print(name)
    return 0
