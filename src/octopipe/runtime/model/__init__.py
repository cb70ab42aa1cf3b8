"""What a model is to the executor: recipes (bundled, `hf:`, `module:factory`), the split by FQN,
recomputation and split backward. Describes and builds modules; runs no step, starts nothing."""

MUST_NOT_IMPORT = ("data", "checkpoint", "step", "job", "launch", "measure")
