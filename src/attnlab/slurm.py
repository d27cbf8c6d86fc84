"""What a SLURM job's resources must be for the trainer it runs (``hydra/launcher=slurm``), and Lightning's cluster
environment under SLURM with its auto-requeue off (SLURM alone requeues: the launcher's docstring says why)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig

# SLURM's SIGTERM to this job (requeue, preemption, cancel), as hydra/launcher=slurm's job records it: every process
# of the job step gets it, W&B's service among them, so the W&B logger drops what it can no longer send
TERMINATED: list[int] = []
IN_LAUNCHED_JOB = threading.Event()  # set in a job hydra/launcher=slurm started (SLURM, not Lightning, requeues it)


def processes_per_node(devices: Any) -> int | None:
    """The processes Lightning runs per node for ``trainer.devices``: a count, or a list's length; None for auto."""
    if isinstance(devices, int) and not isinstance(devices, bool):
        return devices
    if isinstance(devices, str) and devices.strip().isdigit():
        return int(devices)
    if isinstance(devices, Sequence) and not isinstance(devices, str):
        return len(devices)
    return None


def gpus_per_node(accelerator: str, devices: Any) -> int | None:
    """``${slurm_gpus:accelerator,devices}``: the GPUs a node must give the trainer; None on the CPU."""
    return None if accelerator == "cpu" else processes_per_node(devices)


def resource_mismatch(params: dict[str, Any], trainer: DictConfig) -> str | None:
    """What in the launcher's resources disagrees with the job's trainer, as one line; None when they agree."""
    tasks = processes_per_node(trainer.get("devices"))
    if tasks is None:
        return (
            f"trainer.devices: {trainer.get('devices')!r} under hydra/launcher=slurm; set the processes per node "
            "as a number (SLURM starts that many tasks on each node)"
        )
    if params.get("tasks_per_node") != tasks:
        return (
            f"hydra.launcher.tasks_per_node: {params.get('tasks_per_node')} tasks per node but trainer.devices={tasks}"
            " (Lightning would wait for ranks that never start); leave it to follow trainer.devices"
        )
    if params.get("nodes") != trainer.get("num_nodes", 1):
        return (
            f"hydra.launcher.nodes: {params.get('nodes')} nodes but trainer.num_nodes={trainer.get('num_nodes', 1)};"
            " leave it to follow trainer.num_nodes"
        )
    gpus = params.get("gpus_per_node") or 0
    wanted = gpus_per_node(trainer.get("accelerator"), tasks) or 0
    if gpus != wanted:
        return (
            f"hydra.launcher.gpus_per_node: {gpus} GPUs per node but trainer.accelerator="
            f"{trainer.get('accelerator')} with trainer.devices={tasks} needs {wanted}; leave it to follow the trainer"
        )
    return None


def cluster_plugins() -> list[Any]:
    """Lightning's ``SLURMEnvironment`` (the one it would pick itself) without auto-requeue in a job that
    ``hydra/launcher=slurm`` started; else none (Lightning's own choice: a user's sbatch script keeps its auto-requeue).
    """
    from lightning.fabric.plugins.environments import SLURMEnvironment

    return [SLURMEnvironment(auto_requeue=False)] if IN_LAUNCHED_JOB.is_set() and SLURMEnvironment.detect() else []
