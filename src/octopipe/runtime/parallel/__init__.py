"""Tensor and sharded data parallelism of the executor's stages, on a DP x PP x TP mesh; shards
modules over process groups and knows no model recipe, no step, no job.

- `layout`: which global rank runs what (TP fastest, then PP, then DP); no torch;
- `mesh`: the job's process groups (with the run's timeout) and its `DeviceMesh`;
- `tensor_parallel`: `apply_tp(module, mesh, plan)`, torch's parallel styles by FQN; the
  parallel loss; gradients settled to their parameters' layout;
- `tp_plans`: the plans of our bundled models, of Hugging Face Llama-structure models, and a
  user's `tp_plan` hook;
- `fsdp`: `--zero 3`, each stage an FSDP2 unit, gathered and reduced where the plan says;
- `parallelize`: TP then FSDP2 applied to each stage a rank builds (on the meta device);
- `init`: sharded modules initialized as one process initializes them;
- `dtensors`: local shards, whole tensors and shard counts, for code that must not care;
- `groups`: process subgroups that keep the run's timeout.

Point-to-point transfers stay in `octopipe.runtime.step.comm` (each TP rank sends its shard),
data-parallel all-reduces in `octopipe.runtime.step.reduce`.
"""

MUST_NOT_IMPORT = ("data", "checkpoint", "model", "step", "job", "launch", "measure")
