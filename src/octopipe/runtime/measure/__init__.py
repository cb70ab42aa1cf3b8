"""Measured profiles: every layer's F, I, W and sizes (`profiler`), the link (`linkprobe`), in
ranks started as a run's (`profile_job`). Trains nothing: no job, no checkpoint."""

MUST_NOT_IMPORT = ("job", "checkpoint")
