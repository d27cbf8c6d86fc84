"""Logger factories referenced from conf/logger, and what a finished run adds to its W&B summary."""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import Logger, WandbLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from attnlab.errors import require
from attnlab.files import write_atomic
from attnlab.hub import wandb_mode
from attnlab.slurm import TERMINATED
from attnlab.training.sweeps import SweepJob, current_job

# results.json entries that repeat a metric the run already logged under its own name (val/loss, outliers/...):
# sent again they would show each metric twice in W&B
LOGGED_RESULTS = ("val_loss", "val_ppl", "monitor")


def wandb_logger(
    project: str,
    save_dir: str,
    experiment: str,
    tags: list[str],
    name: str,
    group: str | None = None,
    job_type: str = "train",
    extra_tags: Sequence[str] = (),
    name_keys: Sequence[str] = (),
) -> WandbLogger:
    """A W&B run tagged with attention/model/data/seed, one per Hydra job, named and grouped by ``run_identity``;
    the table engine sets the group (``table3-cpu``), the job type (its stage) and extra tags (table, scale)."""
    Path(save_dir).mkdir(parents=True, exist_ok=True)
    name, group, tags = run_identity(name, group, [*tags, *extra_tags], experiment, current_job(), name_keys)
    logger = ResumableWandbLogger(
        project=project,
        save_dir=save_dir,
        group=group,
        job_type=job_type,
        tags=tags,
        name=name,
        mode=wandb_mode(),
        id=run_id(Path(save_dir)),
        resume="allow",
    )
    # Lightning always passes wandb.init an ``anonymous`` argument (None unless asked), which wandb >= 0.19 answers
    # with a warning that the setting has no effect; not passing it is the same run without the warning
    logger._wandb_init.pop("anonymous", None)
    return logger


def needs_package(logger: str, modules: Sequence[str], extra: str) -> None:
    """One line naming ``logger`` and the install command when none of ``modules`` is installed (the optional
    loggers' packages are extras), before Lightning fails deep inside with an import error."""
    from importlib.util import find_spec

    require(
        any(find_spec(module) is not None for module in modules),
        "logger",
        f"{logger} needs the {modules[0]} package: pip install 'attnlab[{extra}]'",
    )


def tensorboard_logger(
    save_dir: str, run_dir: str, experiment: str, name: str, group: str | None = None, name_keys: Sequence[str] = ()
) -> Logger:
    """Lightning's TensorBoardLogger, each run at ``<save_dir>/<group>/<name>_<run directory>``: named and grouped by
    ``run_identity`` as the W&B runs are, and never two runs in one directory (same name, another seed or start)."""
    needs_package("tensorboard", ("tensorboard", "tensorboardX"), "tensorboard")
    from lightning.pytorch.loggers import TensorBoardLogger

    name, group, _ = run_identity(name, group, [], experiment, current_job(), name_keys)
    return TensorBoardLogger(save_dir, name=group, version=f"{name}_{Path(run_dir).name}", default_hp_metric=False)


def mlflow_logger(
    tracking_uri: str,
    experiment: str,
    name: str,
    tags: list[str],
    group: str | None = None,
    name_keys: Sequence[str] = (),
) -> Logger:
    """Lightning's MLFlowLogger: the group (``run_identity``, as W&B's) is the MLflow experiment, the run is named as
    in W&B, and each W&B tag is an MLflow tag (set to ``true``: MLflow's tags are pairs)."""
    needs_package("mlflow", ("mlflow",), "mlflow")
    from lightning.pytorch.loggers import MLFlowLogger

    name, group, tags = run_identity(name, group, tags, experiment, current_job(), name_keys)
    return MLFlowLogger(
        experiment_name=group, run_name=name, tracking_uri=tracking_uri, tags={tag: "true" for tag in tags}
    )


class ResumableWandbLogger(WandbLogger):
    """Lightning's ``WandbLogger`` that outlives its service process in a SLURM job being requeued: SLURM's SIGTERM
    reaches W&B's service as it reaches training, and a failed send in the middle of the last step would stop that
    step where last.ckpt cannot hold it (its batch drawn, its update not made); those metrics are dropped instead,
    so the step ends, is saved, and the job resumes from it bit for bit."""

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        try:
            super().log_metrics(metrics, step)
        except ConnectionError as exc:
            if not TERMINATED:
                raise
            rank_zero_warn(f"W&B's service ended with the job ({exc}); step {step}'s metrics are in csv/ only")


def run_id(save_dir: Path) -> str:
    """The W&B run id of the training run in ``save_dir``: made when it first starts and kept in ``wandb/run_id``, so
    the same run resumed (a requeued SLURM job, ``ckpt_path=`` into its directory) continues that W&B run."""
    path = save_dir / "wandb" / "run_id"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, secrets.token_hex(6))  # W&B takes any unique string as a run id
    return path.read_text().strip()


def run_identity(
    name: str, group: str | None, tags: Sequence[str], experiment: str, job: SweepJob | None, name_keys: Sequence[str]
) -> tuple[str, str, list[str]]:
    """A run's W&B name, group and tags. A single run: ``name``, grouped by ``experiment``. A ``-m`` job: ``name``
    and the overrides its sweep varies (``tiny-vanilla-s1337-optim.lr=0.001``) but for ``name_keys``, the ones the
    name already shows (model, attention, seed); grouped by its sweep (``<experiment>-<sweep directory>``, the same
    for a resumed sweep) and tagged ``swept:<key>`` per swept key. A ``group`` that is set (the table engine's) is
    kept."""
    if job is None:
        return name, group or experiment, list(tags)
    shown = [override for key, override in job.overrides.items() if key not in name_keys]
    return (
        "-".join([name, ",".join(shown)]) if shown else name,
        group or f"{experiment}-{job.directory.name}",
        [*tags, *(f"swept:{key}" for key in job.keys)],
    )


# settings that say where or how a run writes, not what it is: left out of the loggers' config panels
NOT_THE_RUN = {
    "data": ("_target_", "cache_dir", "packed_dir", "num_workers"),
    "trainer": ("_target_", "default_root_dir", "plugins", "enable_model_summary"),
}


def logged_config(cfg: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """The config W&B (and the CSV log's hparams.yaml) show for a run: its spec (model as built, attention,
    optimiser, schedule), the data and trainer settings and the seed, which tell runs apart; not the composed
    config's paths, ``_target_`` keys or display switches (``print_config``, the progress bar)."""
    from attnlab.configs import plain

    sections = {
        name: {key: value for key, value in plain(cfg[name]).items() if key not in dropped}
        for name, dropped in NOT_THE_RUN.items()
    }
    return {
        "experiment_name": cfg.experiment_name,
        "seed": cfg.seed,
        **{key: spec[key] for key in ("model", "attention", "optim", "schedule_steps")},
        **sections,
        "train_tokens": cfg.get("train_tokens"),
        "global_batch_tokens": cfg.get("global_batch_tokens"),
    }


def numbers(results: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The numeric entries of a results dict, nested ones (``eval``) flattened as ``eval/<key>``."""
    flat: dict[str, float] = {}
    for key, value in results.items():
        if isinstance(value, dict):
            flat |= numbers(value, f"{prefix}{key}/")
        elif isinstance(value, int | float) and not isinstance(value, bool):
            flat[f"{prefix}{key}"] = value
    return flat


def log_results(loggers: Sequence[Logger], results: dict[str, Any]) -> None:
    """results.json's numbers (unigram baseline, parameters, tokens/s, eval) in each W&B run's summary, so the
    dashboard compares runs on them side by side; those the run logged as metrics (val/loss) are there already."""
    summary = numbers({key: value for key, value in results.items() if key not in LOGGED_RESULTS})
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            logger.experiment.summary.update(summary)
