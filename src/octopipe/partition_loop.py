"""The min-max partitioner's inner loop (`partition._prefix_bottlenecks`): one stage's row of
the prefix-bottleneck table from the row before it, on arrays, compiled where numba imports
(`octopipe.compiled`). The layout search's balanced baselines ask for the table hundreds of
times over models of a hundred layers and more."""

from __future__ import annotations

from octopipe.compiled import jit


@jit
def next_row(prev, prefix, speed, s, S, out, starts):
    """out[j - s - 1]: the smallest bottleneck of layers [0, j) in stages 0..s, from
    prev[i - s]: that of [0, i) in stages 0..s-1 (`starts`: scratch of out's length).

    Stage s's time shrinks as its start i grows; the shorter prefix's bottleneck need not grow
    with i (stages differ in speed), but a start whose shorter prefix is no faster than a later
    start's is never better. The others form a stack along which the prefix bottleneck rises
    while the stage time falls: the best start is where they cross (bisection)."""
    num_layers = prefix.shape[0] - 1
    top = 0  # starts[:top]: the undominated starts, ascending, with rising prev
    for j in range(s + 1, num_layers - (S - 1 - s) + 1):
        last = prev[j - 1 - s]
        while top and prev[starts[top - 1] - s] >= last:
            top -= 1
        starts[top] = j - 1
        top += 1
        pj = prefix[j]
        lo, hi = 0, top - 1  # the first position whose prev >= its stage time
        while lo < hi:
            mid = (lo + hi) // 2
            i = starts[mid]
            if prev[i - s] >= (pj - prefix[i]) / speed:
                hi = mid
            else:
                lo = mid + 1
        i = starts[lo]
        value = max(prev[i - s], (pj - prefix[i]) / speed)
        if lo:
            i = starts[lo - 1]
            value = min(value, max(prev[i - s], (pj - prefix[i]) / speed))
        out[j - s - 1] = value
