"""The search's inner loops as machine code: `jit` compiles a loop written on numpy arrays with
numba, where it imports, and otherwise leaves it as Python (the same source, the same figures,
slower). The loops: the list scheduler's (`schedules/list_loop.py`), the one-pass timing's
(`sim/quick_loop.py`) and the min-max partitioner's table (`partition_loop.py`).

    @jit
    def loop(arrays...): ...      # machine code, cached beside the module by numba

OCTOPIPE_COMPILED=0 leaves them as Python (to compare, or where numba misbehaves); a compiled
loop's Python source stays at `loop.py_func`.
"""

from __future__ import annotations

import os
from collections.abc import Callable


def jit(loop: Callable) -> Callable:
    """`loop` compiled by numba (its machine code cached on disk), or `loop` itself where numba
    cannot be imported or OCTOPIPE_COMPILED=0."""
    if os.environ.get("OCTOPIPE_COMPILED", "1") == "0":
        return loop
    try:
        from numba import njit
    except ImportError:
        return loop
    try:
        return njit(cache=True)(loop)
    except RuntimeError:  # nowhere to write numba's cache (a read-only install, no home)
        return njit(loop)  # compiled again in each process


def python_of(loop: Callable) -> Callable:
    """The loop as Python, compiled or not (tests run both and compare)."""
    return getattr(loop, "py_func", loop)
