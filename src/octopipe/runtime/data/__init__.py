"""Training data: token files, synthetic batches, each replica's share split into microbatches.
Pure data: imports no other part of the runtime (no model, no process group, no step)."""

MUST_NOT_IMPORT = ("checkpoint", "parallel", "model", "step", "job", "launch", "measure")
