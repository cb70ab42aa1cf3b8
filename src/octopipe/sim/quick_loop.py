"""`quick.py`'s one pass over a plan's orders, on arrays, compiled by numba where it imports
(`octopipe.compiled`). A layout search times thousands of screening plans this way; compiled,
the pass costs a small part of building the plan.

A device's orders reach the loop as rows of (stage, kind code, mb), converted once per order:
the plans of one schedule share their order tuples (`make_plan` keeps them), so the conversion
is kept by the tuple's identity.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from octopipe.actions import F_CODE, I_CODE, W_CODE
from octopipe.compiled import jit

# Actions of the orders converted and kept (12 bytes each): a search's screening plans use
# about 3 million.
KEPT_ACTIONS = 4_000_000


@jit
def one_pass(rows, row_start, dur, mem, lag, M, free_at, busy, level, top, last_t, last_w):
    """Each device's actions in order, each as soon as its device is free and what it waits
    for has run (`quick.py`); False where a dependency is never run (the pass cannot finish).
    Per device, its end, busy seconds, activation level and peak; per stage, when its last B
    or W ends and whether a W."""
    nd = free_at.shape[0]
    S = dur.shape[0]
    f_end = np.full(S * M, -1.0)
    b_end = np.full(S * M, -1.0)
    i_end = np.full(S * M, -1.0)
    ptr = row_start[:-1].copy()
    remaining = row_start[nd] - row_start[0]
    last = S - 1
    while remaining:
        progressed = False
        for d in range(nd):
            p = start = ptr[d]
            n = row_start[d + 1]
            if p == n:
                continue
            t = free_at[d]
            lv, hi, work = level[d], top[d], busy[d]
            while p < n:
                s, code, m = rows[p, 0], rows[p, 1], rows[p, 2]
                sm = s * M + m
                t0 = t
                if code == F_CODE:
                    if s > 0:
                        e = f_end[sm - M]
                        if e < 0.0:
                            break
                        e += lag[s - 1]
                        if e > t0:
                            t0 = e
                elif code == W_CODE:
                    e = i_end[sm]
                    if e < 0.0:
                        break
                    if e > t0:
                        t0 = e
                else:
                    e = f_end[sm]
                    if e < 0.0:
                        break
                    if e > t0:
                        t0 = e
                    if s < last:
                        e = b_end[sm + M]
                        if e < 0.0:
                            break
                        e += lag[s]
                        if e > t0:
                            t0 = e
                took = dur[s, code]
                t = t0 + took
                if code == F_CODE:
                    f_end[sm] = t
                else:
                    if code != W_CODE:  # I or B: the stage's backward
                        b_end[sm] = t
                    if code == I_CODE:  # its W waits for it
                        i_end[sm] = t
                    elif t >= last_t[s]:  # a W or a B: the stage's last backward so far
                        last_t[s] = t
                        last_w[s] = code == W_CODE
                work += took
                lv += mem[s, code]
                if lv > hi:
                    hi = lv
                p += 1
            if p != start:
                remaining -= p - start
                ptr[d] = p
                free_at[d] = t
                level[d] = lv
                top[d] = hi
                busy[d] = work
                progressed = True
        if not progressed:
            return False
    return True


class _KeptRows:
    """Device orders converted to (stage, kind code, mb) rows, kept by the order's identity;
    the least recently used dropped past KEPT_ACTIONS. Each order is held with its rows, so
    its id names no other object meanwhile."""

    def __init__(self) -> None:
        self.kept: OrderedDict[int, tuple[tuple, np.ndarray]] = OrderedDict()
        self.actions = 0

    def __call__(self, order: tuple) -> np.ndarray:
        key = id(order)
        if key in self.kept:
            self.kept.move_to_end(key)
            return self.kept[key][1]
        rows = np.array([(s, k.code, m) for s, k, m in order], np.int32).reshape(len(order), 3)
        self.kept[key] = (order, rows)
        self.actions += len(rows)
        while self.actions > KEPT_ACTIONS:
            _, (_, dropped) = self.kept.popitem(last=False)
            self.actions -= len(dropped)
        return rows


order_rows = _KeptRows()


def timed_orders(orders, dur, mem, lag, M: int):
    """The pass over `orders` (per device, a tuple of actions): per device its end, busy
    seconds, activation level at the end and peak; per stage its last B or W's end and whether
    a W. None where the pass cannot finish."""
    nd = len(orders)
    arrays = [order_rows(o) for o in orders]
    row_start = np.zeros(nd + 1, np.int64)
    row_start[1:] = np.cumsum([len(a) for a in arrays])
    rows = np.concatenate(arrays) if nd else np.empty((0, 3), np.int32)
    S = len(dur)
    free_at, busy, level, top = np.zeros(nd), np.zeros(nd), np.zeros(nd), np.zeros(nd)
    last_t, last_w = np.zeros(S), np.zeros(S, np.bool_)
    done = one_pass(
        rows,
        row_start,
        np.array(dur, np.float64).reshape(S, 4),
        np.array(mem, np.float64).reshape(S, 4),
        np.array(lag, np.float64),
        M,
        free_at,
        busy,
        level,
        top,
        last_t,
        last_w,
    )
    if not done:
        return None
    last_bwd = list(zip(last_t.tolist(), last_w.tolist()))
    return free_at.tolist(), busy.tolist(), level.tolist(), top.tolist(), last_bwd
