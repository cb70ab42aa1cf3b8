"""Laying a model out on a cluster: TP x PP x DP degrees, microbatches, and their plans.

- `cluster.py`: GPUs in nodes, and the topology one pipeline replica sees;
- `layout.py`: what a layout is (`JobShape`, `Job`) and which ones a job allows;
- `stack.py`: the training framework's settings shared by every layout (`Stack`);
- `costs.py`: a layout's profile and what its step costs beyond the pipeline (`LayoutCosts`);
- `estimate.py`: one given layout predicted (`octopipe estimate`);
- `spec.py`: a layout written as `tp8,pp16,dp24,b1,v2` (`--from-layout`);
- `planner.py`: one layout's plans: a baseline, the screening, the tuner, bounds (`LayoutSearch`);
- `search.py`: the layout search of `octopipe plan --gpus` (`plan_cluster`);
- `reference.py`: Megatron-LM's usual layout and the user's own, beside every answer.
"""

from octopipe.layouts.cluster import Cluster, parse_gpus
from octopipe.layouts.costs import LayoutCosts
from octopipe.layouts.layout import MAX_MICROBATCH_SIZE, Job, JobShape, candidate_layouts, divisors
from octopipe.layouts.planner import LayoutSearch, Row
from octopipe.layouts.reference import megatron_layout, reference_row
from octopipe.layouts.search import LayoutReport, plan_cluster

__all__ = [
    "MAX_MICROBATCH_SIZE",
    "Cluster",
    "Job",
    "JobShape",
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
