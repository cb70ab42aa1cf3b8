"""Placements: which device runs each stage. The one home of stage-to-device maps.

A placement is a tuple: stage index -> device. The named schedules use `interleaved` (Megatron's
looping map; one chunk is sequential) and `v_shape` (ZB-V, DualPipeV); `torchtitan_style` says
which maps torchtitan builds itself; `seed_placements` are the tuner's starting points, on any
device order (e.g. the devices with most memory first, since early stages hold the most
activations). The tuner changes placements further by moves (`tuner/moves.py`).
"""

from __future__ import annotations

from collections.abc import Sequence

from octopipe.profile import Device

Placement = tuple[int, ...]


def interleaved(order: Sequence[int], chunks: int) -> Placement:
    """Chunk c of device order[k] is stage c * P + k (Megatron's looping placement)."""
    return tuple(order[s % len(order)] for s in range(len(order) * chunks))


def v_shape(order: Sequence[int], chunks: int) -> Placement:
    """Chunks alternate direction: 0..P-1, P-1..0, ... (ZB-V, DualPipeV for two chunks)."""
    out: list[int] = []
    for c in range(chunks):
        out.extend(order if c % 2 == 0 else reversed(order))
    return tuple(out)


def torchtitan_style(placement: Sequence[int], num_devices: int) -> str | None:
    """'loop' or 'v' when torchtitan builds this stage-to-device map itself, else None.

    torchtitan places stage s on rank s % P ("loop"), or, with two stages per rank, stages
    d and 2P - 1 - d on rank d ("v"); it has no way to express other maps.
    """
    P, S = num_devices, len(placement)
    if S % P:
        return None
    if tuple(placement) == interleaved(range(P), S // P):
        return "loop"
    if S == 2 * P and tuple(placement) == v_shape(range(P), 2):
        return "v"
    return None


def device_orders(devices: Sequence[Device]) -> list[tuple[int, ...]]:
    """Natural order, plus most-memory-first and fastest-first when the devices differ."""
    natural = tuple(range(len(devices)))
    orders = [natural]
    for key in (lambda d: -devices[d].memory_bytes, lambda d: -devices[d].speed):
        order = tuple(sorted(natural, key=key))
        if order not in orders:
            orders.append(order)
    return orders


def seed_placements(
    devices: Sequence[Device],
    max_chunks: int,
    num_layers: int,
    min_chunks: int = 1,
    heavy_last: bool = False,
) -> list[tuple[str, Placement]]:
    """Labelled placements for every chunk count min_chunks..max_chunks that the layer count
    allows; with `heavy_last` (a last layer of about a device's share of the work), those that
    give it a device of its own too."""
    P = len(devices)
    out: list[tuple[str, Placement]] = []
    for k, order in enumerate(device_orders(devices)):
        tag = "" if k == 0 else f"/order{k}"
        for chunks in range(min_chunks, max_chunks + 1):
            if P * chunks > num_layers:
                break
            if chunks == 1:
                out.append((f"sequential{tag}", interleaved(order, 1)))
                continue
            out.append((f"interleaved{chunks}{tag}", interleaved(order, chunks)))
            if P > 1:
                out.append((f"v{chunks}{tag}", v_shape(order, chunks)))
        if heavy_last and P > 2:
            for chunks in range(max(min_chunks, 1), max_chunks + 1):
                if (P - 1) * chunks + 1 > num_layers:
                    break
                out.append((f"dealt{chunks}{tag}", dealt_with_last_alone(order, chunks)))
    return out


def dealt_with_last_alone(order: Sequence[int], chunks: int) -> Placement:
    """Stages dealt round-robin over all devices but the last of `order`, `chunks` each, then
    one last stage on that device alone: a heavy last layer (a large vocabulary's head) gets a
    device of its own while the blocks fill the others."""
    return (*interleaved(order[:-1], chunks), order[-1])
