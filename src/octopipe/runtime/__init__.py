"""The executor: runs any valid plan on real devices through torch.distributed.

- `deps`: the plan's dependency graph and the checks before a run (acyclic, fits model and world);
- `shapes`: what crosses each stage boundary, learned once before training;
- `comm`: non-blocking point-to-point transfers of activations and gradients;
- `stage`: one stage's forward, full backward and split backward (I, W);
- `weightgrad`: split backward: I leaves linear/embedding weight gradients to W's matmuls;
- `worker`: one rank running its action list, then the optimizer step;
- `session`: one rank's whole job, and the result assembled from every rank;
- `launcher`: spawned processes or torchrun; failures propagate, nothing is left running;
- `profiler`, `linkprobe`: measured profiles (every layer's F, I, W and sizes; the link);
- `reference`: single-process ground truth; `fuzz`: random plans. Traces of a run: `octopipe.trace`.

Use: `octopipe run --plan plan.json --model tiny-llama --nproc 2 --json --trace trace.json`
spawns the ranks itself (gloo on loopback, or NCCL with a GPU per rank);
`torchrun --nproc-per-node 8 -m octopipe run --plan plan.json --model NAME` runs one rank per
process of an existing job. From Python: `launch([Job(plan, RunConfig("tiny-llama"))], nproc=2)`.
"""

from octopipe.runtime.launcher import RankFailure, execute, launch
from octopipe.runtime.session import Job, RunConfig, RunResult
from octopipe.runtime.worker import OptimizerConfig

__all__ = ["Job", "OptimizerConfig", "RankFailure", "RunConfig", "RunResult", "execute", "launch"]
