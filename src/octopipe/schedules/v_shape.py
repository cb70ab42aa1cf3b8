"""ZB-V and DualPipeV: two stages per device, placed in a V (device d holds d and 2P-1-d).

Both are phase scripts on the shared `OrderWriter`: each phase repeats a short pattern of
(chunk, kind) steps a number of times that depends on the device's distance from the V's
tip. They reproduce the compute orders of `torch.distributed.pipelining`'s
`ScheduleZBVZeroBubble` and `ScheduleDualPipeV` (whose overlapped forward+backward pairs we
write as the forward followed by the backward).
"""

from __future__ import annotations

from octopipe.actions import Action
from octopipe.schedules.writer import OrderWriter


def zbv_order(device: int, num_devices: int, num_microbatches: int) -> tuple[Action, ...]:
    """ZB-V (Qi et al. 2024, section 6): F/I/W of both chunks, W right after I while steady.

    With fewer than 2P-1 microbatches the rule is written for 2P-1 and the missing
    microbatches are dropped, as PyTorch does.
    """
    P, d = num_devices, device
    first, second = d, 2 * P - 1 - d  # the V's down leg and up leg on this device
    n = max(2 * P - 1, num_microbatches)
    out = OrderWriter()
    for _ in range(2 * (P - d) - 1):  # fill the down leg
        out.forward(first)
    for _ in range(d):  # the up leg's first microbatches arrive
        out.forward(second)
        out.forward(first)
    for _ in range(P - d):  # the up leg starts its backwards
        out.forward(second)
        _input_then_weight(out, second)
    while out.forwards_done(second) < out.forwards_done(first) or out.forwards_done(first) < n:
        if out.forwards_done(first) < n:
            out.forward(first)
        _input_then_weight(out, first)
        out.forward(second)
        _input_then_weight(out, second)
    for _ in range(d):  # drain: backwards of both legs, weights deferred
        out.backward(first, split=True)
        out.backward(second, split=True)
    for _ in range(P - d):
        out.backward(first, split=True)
        out.weight(first)
    while out.weight(second):
        pass
    return out.finish(num_microbatches)


def dualpipev_order(device: int, num_devices: int, num_microbatches: int) -> tuple[Action, ...]:
    """DualPipeV (DeepSeek): a forward of one leg next to a full backward of the other.

    The tail splits the backward into I and W (from the middle of the last phase on, earlier on
    odd devices) to fill the drain with weight gradients.
    """
    P, d, M = num_devices, device, num_microbatches
    first, second = d, 2 * P - 1 - d
    out = OrderWriter()
    for _ in range(2 * (P - d - 1)):
        out.forward(first)
    for _ in range(d + 1):
        out.forward(first)
        out.forward(second)
    for _ in range(P - d - 1):
        out.backward(second, split=True)
        out.weight()
        out.forward(second)
    for _ in range(M - 2 * P + d + 1):  # steady: F of one leg beside B of the other
        out.forward(first)
        out.backward(second, split=False)
        out.forward(second)
        out.backward(first, split=False)
    for _ in range(P - d - 1):
        out.backward(second, split=False)
        out.forward(second)
        out.backward(first, split=False)
    half = (d + 1) // 2
    split = False
    for i in range(d + 1):
        if i == half and d % 2 == 1:
            split = True
        out.backward(second, split)
        if i == half and d % 2 == 0:
            split = True
        out.backward(first, split)
    for _ in range(P - d - 1):
        out.weight()
        out.backward(first, split)
    return out.finish(M)


def _input_then_weight(out: OrderWriter, stage: int) -> None:
    out.backward(stage, split=True)
    out.weight(stage)
