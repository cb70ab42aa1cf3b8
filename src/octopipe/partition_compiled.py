"""`partition._prefix_bottlenecks` compiled by numba: the same table bit for bit
(tests/test_partition_compiled.py holds the two to each other). The layout search's balanced
baselines ask for it hundreds of times over models of a hundred layers and more."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _table(prefix, speeds):
    num_layers, S = prefix.shape[0] - 1, speeds.shape[0]
    width = num_layers - S + 1
    out = np.empty((S, width))
    speed = speeds[0]
    for j in range(1, width + 1):
        out[0, j - 1] = prefix[j] / speed
    starts = np.empty(width, np.int64)
    for s in range(1, S):
        speed = speeds[s]
        top = 0  # starts[:top]: the undominated starts, ascending, with rising prev
        for j in range(s + 1, num_layers - (S - 1 - s) + 1):
            last = out[s - 1, j - 1 - s]
            while top and out[s - 1, starts[top - 1] - s] >= last:
                top -= 1
            starts[top] = j - 1
            top += 1
            pj = prefix[j]
            lo, hi = 0, top - 1
            while lo < hi:
                mid = (lo + hi) // 2
                i = starts[mid]
                if out[s - 1, i - s] >= (pj - prefix[i]) / speed:
                    hi = mid
                else:
                    lo = mid + 1
            i = starts[lo]
            value = max(out[s - 1, i - s], (pj - prefix[i]) / speed)
            if lo:
                i = starts[lo - 1]
                value = min(value, max(out[s - 1, i - s], (pj - prefix[i]) / speed))
            out[s, j - s - 1] = value
    return out


def prefix_bottlenecks(prefix, speeds) -> list[list[float]]:
    """`partition._prefix_bottlenecks(prefix, speeds)` (without its deadline)."""
    table = _table(np.asarray(prefix, np.int64), np.asarray(speeds, np.float64))
    return table.tolist()
