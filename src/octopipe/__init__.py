"""OctoPipe: pipeline parallelism that co-optimizes partition, placement and scheduling."""

__version__ = "0.1.0"
