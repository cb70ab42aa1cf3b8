"""The executor: trains any model with any valid plan on real devices through torch.distributed.

- `recipe`: what the executor knows of a model (build, layers, init, stage forward, loss, data);
- `split`: a model split by module FQNs: meta build, pruning to stages, init per (seed, FQN);
- `hf`: Hugging Face causal LMs (`hf:PATH`) through an adapter; `data`: global batches, token
  files, each replica's share;
- `deps`: the plan's dependency graph and the checks before a run (acyclic, fits model and world);
- `shapes`: what crosses each stage boundary, learned once before training;
- `comm`: non-blocking point-to-point transfers of activations and gradients;
- `stage`: one stage's forward, full backward and split backward (I, W);
- `weightgrad`: split backward: I leaves linear/embedding weight gradients to W's matmuls;
- `worker`: one rank running its action list, then the optimizer step; `reduce`: data-parallel
  gradient all-reduces; `optim`: optimizer, learning-rate schedule, global-norm clipping;
- `overlap`: steps back to back with post-validated per-stage updates (`--overlap-steps`);
- `checkpoint`: DCP checkpoints keyed by FQN, resumable under any plan and data parallelism,
  written whole; `checkpoint_folder`: which one to resume (damaged ones skipped), the folder's
  lock and free space; `checkpoint_metadata`: DCP's index read without running code;
- `session`: one rank's whole job, and the result assembled from every rank;
- `launcher`: spawned processes or torchrun; failures propagate, nothing is left running;
- `spawn`: one process per rank, watched; `lifeline`: a rank exits with its launcher;
- `progress`: each step's loss and time on every rank (streamed; a non-finite loss stops all);
- `groups`: subgroups with the run's timeout; `preflight`: settings refused before any rank;
- `parallel`: tensor parallelism (`--tp`) and FSDP2 (`--zero 3`) on a DP x PP x TP mesh, and the
  rank layout;
- `profiler`, `linkprobe`: measured profiles (every layer's F, I, W and sizes; the link);
- `measure`: a profile measured in processes that start as a run's ranks (`octopipe profile`);
- `reference`: single-process ground truth; `fuzz`: random plans; `torch_pipelining`: the same
  stages under PyTorch's own runtime, for comparison. Traces of a run: `octopipe.trace`.

Use: `octopipe run --plan plan.json --model tiny-llama --nproc 2 --json --trace trace.json`
spawns the ranks itself (gloo on loopback, or NCCL with a GPU per rank);
`torchrun --nproc-per-node 8 -m octopipe run --plan plan.json --model NAME` runs one rank per
process of an existing job. From Python: `octopipe.run(plan, "tiny-llama", steps=3)`
(`octopipe/api.py`), or `launch([Job(plan, RunConfig("tiny-llama"))], nproc=2)` for several jobs.
"""

# A hung transfer fails after this instead of blocking forever. Here, not in `launcher`, so the
# CLI can show it without importing torch (this package's __init__ imports nothing).
DEFAULT_TIMEOUT_S = 120.0
