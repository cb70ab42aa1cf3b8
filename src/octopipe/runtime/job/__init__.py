"""One rank's whole training job (`session`): steps, checkpoints, held-out evaluation, progress,
logs, FLOPs; and the result rank 0 assembles. Runs inside a rank: starts no processes."""

MUST_NOT_IMPORT = ("launch", "measure")
