"""Small real torch models of heterogeneous families, for running and profiling."""
