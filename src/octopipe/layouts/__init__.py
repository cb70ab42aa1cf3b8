"""Laying a model out on a cluster: TP x PP x DP degrees, microbatches, and their plans.

- `cluster.py`: GPUs in nodes, and the topology one pipeline replica sees;
- `layout.py`: what a layout is (`Layout`, `Job`) and which ones a job allows;
- `search.py`: the layout search of `octopipe plan --gpus` (`LayoutSearch`, `plan_cluster`);
- `reference.py`: Megatron-LM's usual layout, the reference beside every answer.
"""

from octopipe.layouts.cluster import Cluster, parse_gpus
from octopipe.layouts.costs import LayoutCosts
from octopipe.layouts.layout import MAX_MICROBATCH_SIZE, Job, Layout, candidate_layouts, divisors
from octopipe.layouts.reference import megatron_layout, reference_row
from octopipe.layouts.search import LayoutReport, LayoutSearch, Row, plan_cluster

__all__ = [
    "MAX_MICROBATCH_SIZE",
    "Cluster",
    "Job",
    "Layout",
    "LayoutCosts",
    "LayoutReport",
    "LayoutSearch",
    "Row",
    "candidate_layouts",
    "divisors",
    "megatron_layout",
    "parse_gpus",
    "plan_cluster",
    "reference_row",
]
