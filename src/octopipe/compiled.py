"""Where the inner loops run compiled: numba's machine code for the loops a search repeats
millions of times (`schedules/list_compiled.py`, `sim/quick_compiled.py`), each the same
figures bit for bit as its Python loop, which stays the reference and the fallback.

    run = compiled("octopipe.sim.quick_compiled", "quick_evaluate") or python_loop

OCTOPIPE_COMPILED=0 takes the Python loops (to compare, or where numba misbehaves).
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable


@functools.cache
def compiled(module: str, name: str) -> Callable | None:
    """`module.name`, or None where numba cannot be imported or OCTOPIPE_COMPILED=0."""
    if os.environ.get("OCTOPIPE_COMPILED", "1") == "0":
        return None
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError:
        return None
