"""The one mechanism every named schedule is written with: a device's order as a list of steps.

A schedule rule says only *which stage* runs *which kind* of work next on a device ("a forward
of my first chunk", "the oldest pending weight gradient"); `OrderWriter` numbers the microbatches.
Each (stage, kind) has its own counter, so the n-th forward of a stage is microbatch n, and
I and B of a stage share one counter (both are that stage's n-th backward). Weight gradients
(W) wait in a first-in first-out queue of the I actions that produced them.

This module must not know any named schedule; `one_f_one_b.py` and `v_shape.py` hold the rules.
"""

from __future__ import annotations

from collections import Counter, deque

from octopipe.actions import Action, B, F, I, Kind, W


class OrderWriter:
    """Builds one device's compute order step by step."""

    def __init__(self) -> None:
        self._count: Counter[tuple[int, Kind]] = Counter()
        self._pending_w: deque[tuple[int, int]] = deque()  # (stage, mb) whose I ran, W not yet
        self.actions: list[Action] = []

    def forwards_done(self, stage: int) -> int:
        return self._count[(stage, F)]

    def forward(self, stage: int) -> None:
        self._emit(stage, F, self._take(stage, F))

    def backward(self, stage: int, split: bool) -> None:
        """The stage's next backward: a full B, or an I whose W is queued for later."""
        mb = self._take(stage, B)
        if split:
            self._emit(stage, I, mb)
            self._pending_w.append((stage, mb))
        else:
            self._emit(stage, B, mb)

    def weight(self, stage: int | None = None) -> bool:
        """Run the oldest pending W (of `stage`, if given). False when none is pending."""
        for i, (s, mb) in enumerate(self._pending_w):
            if stage is None or s == stage:
                del self._pending_w[i]
                self._emit(s, W, mb)
                return True
        return False

    def drain_weights(self) -> None:
        while self.weight():
            pass

    def finish(self, num_microbatches: int) -> tuple[Action, ...]:
        """The order, without steps a rule wrote for microbatches beyond the real count."""
        self.drain_weights()
        return tuple(a for a in self.actions if a.mb < num_microbatches)

    def _take(self, stage: int, key: Kind) -> int:
        mb = self._count[(stage, key)]
        self._count[(stage, key)] = mb + 1
        return mb

    def _emit(self, stage: int, kind: Kind, mb: int) -> None:
        self.actions.append(Action(stage, kind, mb))
