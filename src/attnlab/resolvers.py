"""What conf/ needs before Hydra composes anything, registered on import: OmegaConf resolvers and the config
nodes generated from the dataclasses (``attention=<preset>``, the model defaults every ``model=`` preset extends)."""

from __future__ import annotations

import secrets
from datetime import datetime

from omegaconf import OmegaConf

# One id per process: a timestamp plus random hex, so two runs started in the same second never share a
# directory, while every interpolation inside one process (hydra.run.dir, a sweep's dir) sees the same id.
RUN_ID = f"{datetime.now():%Y-%m-%d_%H-%M-%S}_{secrets.token_hex(3)}"

if not OmegaConf.has_resolver("run_id"):
    OmegaConf.register_new_resolver("run_id", lambda: RUN_ID)

from attnlab.attention import store_presets  # noqa: E402
from attnlab.models.config import store_defaults  # noqa: E402
from attnlab.tables.cells import register as register_cell_dir  # noqa: E402  (${cell_dir:}: a table cell's name)

register_cell_dir()
store_presets()
store_defaults()
