"""One training step on one rank: the worker's action loop, stages, p2p transfers, overlapped
steps, data-parallel reductions and the optimizer. Knows no job, no files, no processes."""

MUST_NOT_IMPORT = ("checkpoint", "job", "launch", "measure")
