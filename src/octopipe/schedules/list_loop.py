"""The list scheduler's event loop (`list_scheduler.py` says what it decides), on arrays,
compiled by numba where it imports (`octopipe.compiled`).

The tuner spends nearly all of its time in this loop (millions of actions a search); compiled,
it runs tens of times faster than as Python. Numba compiles on the first call and caches the
machine code beside this file (or in the user's cache where that is read-only), so a later
process loads it. The choosing and running of an action are written inline, as one loop over
local names: as Python (without numba) calls and look-ups were most of its cost.

The arrays: per stage its device, in-flight cap, seconds and memory change by kind code
(`dur[s, code]`, `mem[s, code]`), lag and activation bytes; per device its stages in
the order a free device looks at them (`owned` from `owned_start[d]`), its memory budget and
its W kept for the end. The orders come back as one (stage, kind, mb) row per action, device
d's from `order_start[d]`, `order_len[d]` of them.
"""

from __future__ import annotations

import heapq

import numpy as np

from octopipe.actions import B_CODE, F_CODE, I_CODE, W_CODE
from octopipe.compiled import jit

GAVE_UP, DONE, DEADLOCK = 0, 1, 2


@jit
def schedule_loop(
    device_of, cap, owned, owned_start, budget, tail_w, dur, mem, lag_next, act,
    M, split, defer_w, backward_first, oldest_first, reduce_early, give_up_after,
    orders, order_start, order_len, busy, peak, last_backward, free_at, memory_waits,
):  # fmt: skip
    S = device_of.shape[0]
    nd = budget.shape[0]
    inf = np.inf
    f_ready = np.full(S * M, inf)
    f_ready[:M] = 0.0
    b_ready = np.full(S * M, inf)
    next_f = np.zeros(S, np.int64)
    next_bwd = np.zeros(S, np.int64)
    # Per device a queue of deferred W (stage, mb): its slots from its first stage's, S*M in all.
    w_stage = np.empty(S * M, np.int64)
    w_mb = np.empty(S * M, np.int64)
    w_head = np.empty(nd, np.int64)
    w_tail = np.empty(nd, np.int64)
    left_fb = np.empty(nd, np.int64)
    for d in range(nd):
        w_head[d] = w_tail[d] = owned_start[d] * M
        left_fb[d] = 2 * M * (owned_start[d + 1] - owned_start[d])
    urgent_w = np.zeros(nd, np.int64)
    level = np.zeros(nd)
    wakeups = [(0.0, d) for d in range(nd)]
    remaining = S * M * (3 if split else 2)
    last = S - 1

    while remaining:
        if len(wakeups) == 0:
            return DEADLOCK
        now, d = heapq.heappop(wakeups)
        if now > give_up_after:
            return GAVE_UP
        if free_at[d] > now:
            continue
        pending = w_tail[d] - w_head[d]
        kind = -1
        s = -1
        if urgent_w[d] or (pending and not defer_w):
            kind = W_CODE
        else:
            memory_blocked = False
            for turn in range(3):
                if turn == 1:  # forward
                    best, best_mb = -1, M
                    for j in range(owned_start[d], owned_start[d + 1]):
                        t = owned[j]
                        m = next_f[t]
                        if m >= M or m > best_mb:
                            continue
                        inflight = m - next_bwd[t]
                        if inflight >= cap[t] or f_ready[t * M + m] > now:
                            continue
                        if (inflight or pending) and level[d] + act[t] > budget[d]:
                            memory_blocked = True
                            memory_waits[d] += 1
                            continue
                        best, best_mb = t, m
                        if not oldest_first:
                            break
                    if best >= 0:
                        kind, s = F_CODE, best
                        break
                elif (turn == 0) == backward_first:  # backward
                    best, best_mb = -1, M
                    for j in range(owned_start[d], owned_start[d + 1]):
                        t = owned[j]
                        m = next_bwd[t]
                        if m >= next_f[t] or m > best_mb or b_ready[t * M + m] > now:
                            continue
                        best, best_mb = t, m
                        if not oldest_first:
                            break
                    if best >= 0:
                        s = best
                        kind = B_CODE
                        if split and pending:
                            rise = mem[s, I_CODE]
                            if rise > 0 and level[d] + rise > budget[d]:
                                memory_waits[d] += 1
                                kind = W_CODE
                        break
            if kind < 0 and pending:
                if pending > tail_w[d] or memory_blocked or left_fb[d] == 0:
                    kind = W_CODE
        if kind < 0:
            continue

        if kind == F_CODE:
            m = next_f[s]
            next_f[s] = m + 1
            left_fb[d] -= 1
            code = F_CODE
        elif kind == W_CODE:
            s = w_stage[w_head[d]]
            m = w_mb[w_head[d]]
            w_head[d] += 1
            if urgent_w[d]:
                urgent_w[d] -= 1
            code = W_CODE
        else:
            m = next_bwd[s]
            next_bwd[s] = m + 1
            left_fb[d] -= 1
            code = I_CODE if split else B_CODE
        duration, delta = dur[s, code], mem[s, code]
        end = now + duration
        row = order_start[d] + order_len[d]
        orders[row, 0] = s
        orders[row, 1] = code
        orders[row, 2] = m
        order_len[d] += 1
        free_at[d] = end
        busy[d] += duration
        lv = level[d] + delta
        level[d] = lv
        if lv > peak[d]:
            peak[d] = lv
        remaining -= 1
        heapq.heappush(wakeups, (end, d))
        if kind == F_CODE:
            if s < last:
                at = end + lag_next[s]
                f_ready[(s + 1) * M + m] = at
                heapq.heappush(wakeups, (at, device_of[s + 1]))
            else:
                b_ready[s * M + m] = end
        elif kind == W_CODE:
            if end > last_backward[s]:
                last_backward[s] = end
        else:
            if split:
                w_stage[w_tail[d]] = s
                w_mb[w_tail[d]] = m
                w_tail[d] += 1
                if reduce_early and m == M - 1:
                    urgent_w[d] += _to_front(w_stage, w_mb, w_head[d], w_tail[d], s)
            else:
                last_backward[s] = end
            if s > 0:
                at = end + lag_next[s - 1]
                b_ready[(s - 1) * M + m] = at
                heapq.heappush(wakeups, (at, device_of[s - 1]))
    return DONE


@jit
def _to_front(w_stage, w_mb, head, tail, s):
    """Stage s's queued W before the others, each group in its order; how many are s's."""
    stages = w_stage[head:tail].copy()
    mbs = w_mb[head:tail].copy()
    k = head
    for j in range(tail - head):
        if stages[j] == s:
            w_stage[k], w_mb[k] = stages[j], mbs[j]
            k += 1
    moved = k - head
    for j in range(tail - head):
        if stages[j] != s:
            w_stage[k], w_mb[k] = stages[j], mbs[j]
            k += 1
    return moved
