"""Checkpoints: DCP save and load keyed by FQN (`store`), the folder, its markers and lock
(`folder`), DCP's index read without running code (`metadata`). Files only: no step, no launch."""

MUST_NOT_IMPORT = ("data", "parallel", "model", "step", "job", "launch", "measure")
