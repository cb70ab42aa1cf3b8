"""The executor: trains any model with any valid plan on real devices through torch.distributed.

Grouped by concern, each group importing only those listed before it (each package's
`MUST_NOT_IMPORT` says which it must not; tests/test_house.py holds them to it):

- `data/`: token files, synthetic data, each replica's share of a global batch;
- `checkpoint/`: DCP checkpoints keyed by FQN (`store`), the folder's markers, lock and free
  space (`folder`), DCP's index read without running code (`metadata`);
- `failures`: how a run fails (a rank's failure, a stop), raised by ranks and launcher alike;
- `parallel/`: the rank layout and mesh, tensor parallelism and FSDP2, subgroups with timeouts;
- `model/`: what a model is to the executor: its recipe (`recipe`, dispatched by `load`:
  `bundled`, `hf`, `module:factory`), the split by FQN (`split`), recomputation (`recompute`,
  `hf_attention`) and split backward (`weightgrad`);
- `step/`: one step on one rank: the worker's action loop (`worker`), stages (`stage`), p2p
  transfers (`comm`, `shapes`), the plan's dependency checks (`deps`), data-parallel
  reductions (`reduce`), the optimizer (`optim`), overlapped steps (`overlap`);
- `job/`: one rank's whole job (`session`), held-out evaluation, progress, logs, FLOPs;
- `launch/`: processes: spawned or torchrun (`launcher`, `spawn`), a rank's tie to its
  launcher (`lifeline`), the settings refused before any rank starts (`preflight`);
- `measure/`: measured profiles (`profiler`, `linkprobe`) in ranks started as a run's
  (`profile_job`);
- ground truth, above them all: `reference` (one process), `fuzz` (random plans),
  `torch_pipelining` (the same stages under PyTorch's own runtime). Traces: `octopipe.trace`.

Use: `octopipe run --plan plan.json --model tiny-llama --nproc 2 --json --trace trace.json`
spawns the ranks itself (gloo on loopback, or NCCL with a GPU per rank);
`torchrun --nproc-per-node 8 -m octopipe run --plan plan.json --model NAME` runs one rank per
process of an existing job. From Python: `octopipe.run(plan, "tiny-llama", steps=3)`
(`octopipe/api.py`), or `launch([Job(plan, RunConfig("tiny-llama"))], nproc=2)` for several jobs.
"""
