"""The live progress line of `plan --gpus` on a terminal: layouts screened and tuned of how
many, the best step so far, the time spent and left, and what is planned."""

from __future__ import annotations

from rich.console import Console

from octopipe.layouts.progress import SearchProgress


class SearchLine:
    """A live line on stderr (a terminal only): layouts screened and tuned of how many, the
    best step so far, the time spent and an estimate of what is left, and what is planned."""

    def __init__(self, show: bool):
        self.show = show
        self.live = None

    def __enter__(self):
        if not self.show:
            return None
        from rich.live import Live

        # Redrawn at each report, not by rich's refresh thread: the search forks its workers
        # only while no other thread runs (`layouts/fanout.py`).
        self.live = Live(
            "planning the references",
            console=Console(stderr=True),
            transient=True,
            auto_refresh=False,
        )
        self.live.start(refresh=True)
        return self.report

    def report(self, at: SearchProgress) -> None:
        assert self.live is not None
        from rich.text import Text

        # Folded, not cropped: on a narrow terminal the line takes two.
        self.live.update(Text(progress_line(at), overflow="fold"), refresh=True)

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.stop()


def progress_line(at: SearchProgress) -> str:
    """One line of the search's progress (`plan --gpus` on a terminal)."""
    screened = f"screened {at.screened}"
    if at.phase == "screening" and at.to_screen:
        screened += f" of up to {at.screened + at.to_screen}"
    best = f"best {at.best_step:.3f} s" if at.best_step is not None else "no plan fits yet"
    left = f", about {at.left:.0f} s left" if at.left is not None else ""
    return (
        f"{screened} layouts, tuned {at.tuned} of {at.to_tune}; {best}; "
        f"{at.elapsed:.0f} s{left}; {at.phase} {at.doing}"
    )
