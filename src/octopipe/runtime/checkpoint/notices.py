"""The warnings a checkpoint folder gives (`folder.choose`), apart from the folder's reading so
that a launcher can tell them without importing DCP."""

from __future__ import annotations

from octopipe.errors import OctoPipeWarning


class CheckpointSkipped(OctoPipeWarning):
    """A damaged or unfinished checkpoint passed over for an earlier complete one."""


class CheckpointUnverified(OctoPipeWarning):
    """The checkpoint chosen carries no checksums: a changed byte would go unnoticed."""
