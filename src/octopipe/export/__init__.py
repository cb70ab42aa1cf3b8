"""Writers that hand a plan to torchtitan. The schedule CSV itself is `plan.save_schedule_csv`
(one row per rank of `{stage}{F|B|I|W}{mb}` actions, the format torch's `_load_csv` and
torchtitan's `pipeline_parallel_schedule_csv` read).

- `titan_config`: torchtitan 0.3.x, a Python config module (`octopipe_torchtitan.py`, from the
  template `torchtitan_module.py`), the stage-placement override it may install
  (`torchtitan_stages.py`) and the launch command;
- `titan_toml`: torchtitan up to 0.2, the `torchtitan.toml` job-config fragment;
- `titan_plan`: what both take from a plan (degrees, batch sizes, schedule name, placement);
- `titan_names`: the profile's layer names as torchtitan 0.3's decoder modules.

Nothing here decides or evaluates a plan, and nothing imports torch or torchtitan.
"""

from octopipe.export.titan_config import (
    SHIPPED_BASES,
    TorchtitanBase,
    torchtitan_launch_command,
    write_torchtitan_config,
)
from octopipe.export.titan_names import torchtitan_names
from octopipe.export.titan_plan import module_fqns_per_model_part
from octopipe.export.titan_toml import (
    to_toml,
    toml_string,
    torchtitan_settings,
    write_torchtitan_toml,
)

__all__ = [
    "SHIPPED_BASES",
    "TorchtitanBase",
    "module_fqns_per_model_part",
    "to_toml",
    "toml_string",
    "torchtitan_launch_command",
    "torchtitan_names",
    "torchtitan_settings",
    "write_torchtitan_config",
    "write_torchtitan_toml",
]
