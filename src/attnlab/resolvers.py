"""What conf/ needs before Hydra composes anything, registered on import: OmegaConf resolvers and the config
nodes generated from the dataclasses (``attention=<preset>``, the model defaults every ``model=`` preset extends)."""

from __future__ import annotations

import os
import secrets
from datetime import datetime
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from attnlab.defaults import cache_dir
from attnlab.digest import digest
from attnlab.slurm import gpus_per_node, processes_per_node

_current_run_id: str | None = None


def new_run_id() -> str:
    """Start a new run: a timestamp plus random hex, so two runs started in the same second never share a directory.
    The command line gets one per process (the first ``run_id()``); ``attnlab.train`` / ``evaluate`` one per call."""
    global _current_run_id
    _current_run_id = f"{datetime.now():%Y-%m-%d_%H-%M-%S}_{secrets.token_hex(3)}"
    return _current_run_id


def run_id() -> str:
    """``${run_id:}``: the current run's id, the same in every interpolation of one run (``hydra.run.dir``, a
    sweep's dir, the evaluation record)."""
    return _current_run_id or new_run_id()


def project_root(*, _root_: DictConfig) -> str:
    """``${project_root:}``: the repository that holds the entry point's config directory (``conf/``, or the table
    engine's ``experiments/conf/``): its nearest ancestor with a ``pyproject.toml``, else its parent. Outputs and the
    cache land there whichever directory a command starts from (the lightning-hydra-template anchors them to its
    project root the same way). Hydra records the config directory as its ``main`` config source. An installed
    attnlab (its configs come from the package: ``pkg://``) writes under the job's working directory
    (``hydra.runtime.cwd``: the table engine sets it to its project), and a config composed without Hydra's runtime
    information under the current directory."""
    runtime = OmegaConf.select(_root_, "hydra.runtime", default=None)
    if runtime is None and HydraConfig.initialized():  # inside the job: the task's config has no hydra node
        runtime = HydraConfig.get().runtime
    for source in (runtime.get("config_sources") if runtime is not None else None) or []:
        if source.provider == "main" and source.schema == "file":
            config_dir = Path(source.path).resolve()
            repository = next((d for d in config_dir.parents if (d / "pyproject.toml").is_file()), config_dir.parent)
            return str(repository)
    return str((runtime.get("cwd") if runtime is not None else None) or os.getcwd())


def job_dirname(num: int, overrides: str) -> str:
    """``${job_dirname:num,overrides}``: a sweep job's directory name, ``<num>_<overrides>``; past 120 characters its
    first 100 and a hash of the whole, so a sweep over many or long overrides never passes a file name's 255 bytes."""
    name = f"{num}_{overrides}"
    if len(name.encode()) <= 120:
        return name
    return f"{name.encode()[:100].decode(errors='ignore')}_{digest(name, 10)}"


if not OmegaConf.has_resolver("job_dirname"):
    OmegaConf.register_new_resolver("job_dirname", job_dirname)
if not OmegaConf.has_resolver("run_id"):
    OmegaConf.register_new_resolver("run_id", run_id)
if not OmegaConf.has_resolver("cache_dir"):
    OmegaConf.register_new_resolver("cache_dir", cache_dir)
if not OmegaConf.has_resolver("slurm_tasks"):  # hydra/launcher=slurm's resources, from the trainer
    OmegaConf.register_new_resolver("slurm_tasks", processes_per_node)
    OmegaConf.register_new_resolver("slurm_gpus", gpus_per_node)
if not OmegaConf.has_resolver("project_root"):
    OmegaConf.register_new_resolver("project_root", project_root)

from attnlab.attention import store_presets  # noqa: E402
from attnlab.cells import register as register_cell_dir  # noqa: E402  (${cell_dir:}: a table cell's name)
from attnlab.models.config import store_defaults  # noqa: E402

register_cell_dir()
store_presets()
store_defaults()
