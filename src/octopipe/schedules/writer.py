"""The one mechanism every named schedule is written with: a device's order as a list of steps.

A schedule rule says only *which stage* runs *which kind* of work next on a device ("a forward
of my first chunk", "the oldest pending weight gradient"); `OrderWriter` numbers the microbatches.
Each (stage, kind) has its own counter, so the n-th forward of a stage is microbatch n, and
I and B of a stage share one counter (both are that stage's n-th backward). Weight gradients
(W) wait in a first-in first-out queue of the I actions that produced them.

This module must not know any named schedule; `one_f_one_b.py` and `v_shape.py` hold the rules.
"""

from __future__ import annotations

from collections import deque

from octopipe.actions import Action, B, F, I, Kind, W


class OrderWriter:
    """Builds one device's compute order step by step. Written on a plain dict and inline
    appends: the layout search generates orders of 64 devices x 256 microbatches by the
    dozen, and method calls per action were most of that cost."""

    def __init__(self) -> None:
        self._count: dict[tuple[int, Kind], int] = {}  # (stage, F or B) -> actions so far
        self._pending_w: deque[tuple[int, int]] = deque()  # (stage, mb) whose I ran, W not yet
        self.actions: list[Action] = []

    def forwards_done(self, stage: int) -> int:
        return self._count.get((stage, F), 0)

    def forward(self, stage: int) -> None:
        key = (stage, F)
        mb = self._count.get(key, 0)
        self._count[key] = mb + 1
        self.actions.append(Action(stage, F, mb))

    def backward(self, stage: int, split: bool) -> None:
        """The stage's next backward: a full B, or an I whose W is queued for later."""
        key = (stage, B)
        mb = self._count.get(key, 0)
        self._count[key] = mb + 1
        if split:
            self.actions.append(Action(stage, I, mb))
            self._pending_w.append((stage, mb))
        else:
            self.actions.append(Action(stage, B, mb))

    def weight(self, stage: int | None = None) -> bool:
        """Run the oldest pending W (of `stage`, if given). False when none is pending."""
        pending = self._pending_w
        if stage is None:
            if not pending:
                return False
            s, mb = pending.popleft()
            self.actions.append(Action(s, W, mb))
            return True
        for i, (s, mb) in enumerate(pending):
            if s == stage:
                del pending[i]
                self.actions.append(Action(s, W, mb))
                return True
        return False

    def drain_weights(self) -> None:
        pending, actions = self._pending_w, self.actions
        while pending:
            s, mb = pending.popleft()
            actions.append(Action(s, W, mb))

    def finish(self, num_microbatches: int) -> tuple[Action, ...]:
        """The order, without steps a rule wrote for microbatches beyond the real count."""
        self.drain_weights()
        return tuple(a for a in self.actions if a.mb < num_microbatches)
