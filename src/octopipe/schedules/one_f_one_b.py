"""The 1F1B family: GPipe, 1F1B, interleaved 1F1B, ZB-H1 and ZB-H2 as rules of one loop.

Every member runs, on each device, `warmup` forwards, then pairs of one forward and one
backward, then the remaining backwards; they differ only in the rule's numbers:

- how many forwards run before the first backward (`warmup`): all of them for GPipe, the
  distance to the last stage for 1F1B, plus whole rounds of earlier chunks when interleaved;
- how the chunks of a device take turns (`round_size` microbatches per chunk, forwards in
  chunk order, backwards in reverse chunk order), the Megatron-LM/PyTorch interleaving;
- whether a backward is split into I and W, and how many backwards a W lags behind.

Stages are placed in a loop (stage c*P + d on device d); these orders are the ones
`torch.distributed.pipelining` builds (`Schedule1F1B`, `ScheduleGPipe`,
`ScheduleInterleaved1F1B`, `ScheduleInterleavedZeroBubble`), compute actions only.
"""

from __future__ import annotations

from dataclasses import dataclass

from octopipe.actions import Action
from octopipe.schedules.writer import OrderWriter


@dataclass(frozen=True)
class DeviceRule:
    """How one device runs the 1F1B loop."""

    warmup: int  # forwards before the first backward
    round_size: int  # microbatches one chunk runs before the next chunk takes its turn
    split: bool = False  # backward as I now and W later, instead of one B
    weight_lag: int = 0  # a W runs once this many later backwards have run (split only)


def family_order(
    device: int, num_devices: int, chunks: int, num_microbatches: int, rule: DeviceRule
) -> tuple[Action, ...]:
    """One device's order: `rule.warmup` forwards, forward/backward pairs, then backwards."""
    P, V, M = num_devices, chunks, num_microbatches
    total = V * M  # forwards (and backwards) on this device
    warmup = min(rule.warmup, total)

    def forward_stage(k: int) -> int:  # the k-th forward's stage
        return (k // rule.round_size) % V * P + device

    def backward_stage(k: int) -> int:  # the k-th backward's stage: chunks in reverse
        return (V - 1 - (k // rule.round_size) % V) * P + device

    out = OrderWriter()
    for step in range(warmup + total):
        if step < total:
            out.forward(forward_stage(step))
        k = step - warmup
        if k < 0:
            continue
        out.backward(backward_stage(k), rule.split)
        if rule.split and k >= rule.weight_lag:
            out.weight()  # the oldest pending one; the rest run after the last backward
    return out.finish(M)


# --- the named members: one rule per device -------------------------------------------------


def gpipe_rule(device: int, num_devices: int, chunks: int, num_microbatches: int) -> DeviceRule:
    """Fill and drain: every forward first (chunk by chunk), then every backward."""
    return DeviceRule(warmup=chunks * num_microbatches, round_size=num_microbatches)


def one_f_one_b_rule(
    device: int, num_devices: int, chunks: int, num_microbatches: int
) -> DeviceRule:
    """1F1B (PipeDream-Flush): as many forwards as stages after this one, then alternate."""
    return DeviceRule(warmup=num_devices - 1 - device, round_size=num_microbatches)


def interleaved_rule(
    device: int, num_devices: int, chunks: int, num_microbatches: int
) -> DeviceRule:
    """Interleaved 1F1B (Megatron-LM): whole rounds of the earlier chunks, then two forwards per
    stage still ahead (a forward and a backward must cross each hop before the first backward)."""
    size = round_size(num_devices, num_microbatches)
    return DeviceRule(warmup=(chunks - 1) * size + 2 * (num_devices - 1 - device), round_size=size)


def zbh1_rule(device: int, num_devices: int, chunks: int, num_microbatches: int) -> DeviceRule:
    """ZB-H1 (Qi et al.): 1F1B with split backwards; device d lets its W lag d backwards, which
    fills the drain with weight gradients at 1F1B's peak memory. With several chunks this is
    PyTorch's interleaved zero bubble (ZB1P)."""
    size = round_size(num_devices, num_microbatches)
    return DeviceRule(
        warmup=(chunks - 1) * size + (num_devices - 1 - device),
        round_size=size,
        split=True,
        weight_lag=device,
    )


def zbh2_rule(device: int, num_devices: int, chunks: int, num_microbatches: int) -> DeviceRule:
    """ZB-H2 (Qi et al.): twice 1F1B's warm-up forwards fill the start-up bubble, and W lags
    2d backwards so the drain is filled too; about twice 1F1B's activation memory."""
    return DeviceRule(
        warmup=2 * (num_devices - 1 - device),
        round_size=num_microbatches,
        split=True,
        weight_lag=2 * device,
    )


def round_size(num_devices: int, num_microbatches: int) -> int:
    """Microbatches per chunk turn, as PyTorch's interleaved schedules choose it: the
    microbatches split into max(1, M // P) equal rounds (M = P * rounds in Megatron-LM)."""
    rounds = max(1, num_microbatches // num_devices)
    return num_microbatches // rounds


def rounds_fit(num_devices: int, num_microbatches: int) -> bool:
    return num_microbatches % max(1, num_microbatches // num_devices) == 0
