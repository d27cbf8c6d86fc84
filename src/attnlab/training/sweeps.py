"""Sweeps that survive their failures: each job's error is that job's alone, and the multirun ends with a summary.

Hydra's sweepers re-raise the first failed job after its batch and never reach ``on_multirun_end``; this
callback records every job's outcome in ``<sweep dir>/jobs.jsonl`` (one JSON line per job, the file locked while
a line is written so parallel launchers can share it), marks the failure handled so the sweep goes on, and at the
end prints which jobs failed and why and exits non-zero if any did. Several sweeps may share one directory (the
table engine's ``outputs/runs``), so each record carries its sweep's id and a summary counts that sweep's jobs only.
It also tells the jobs which keys their sweep varies (``current_job``), so their W&B runs are named by those.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from attnlab.errors import ConfigError
from attnlab.run_directory import JOBS_FILE, RunDirectoryInUse, check_writable, in_multirun, read_jobs, record_job

log = logging.getLogger(__name__)

SWEEP_ID = "ATTNLAB_SWEEP_ID"  # set when a multirun starts; its jobs inherit it (same process, joblib, SLURM env)
SWEPT_KEYS = "ATTNLAB_SWEPT_KEYS"  # the keys the multirun varies (a JSON list), passed to its jobs the same way
HELD_ELSEWHERE = "held_elsewhere"  # a job whose directory another process trains in (not a failure)
EXPECTED_ERRORS = (ConfigError,)  # reported in one line; anything else gets its traceback in the job's record


def one_line(error: BaseException) -> str:
    """``error: <message>`` as a single line, the way a single run prints it."""
    return "error: " + " ".join(str(error).split())


def job_sweep_dir(subdir: str | None, output_dir: str) -> Path:
    """The sweep directory a job's ``output_dir`` lies in: ``output_dir`` less its resolved ``hydra.sweep.subdir``.
    Read from the job's own directory, not by resolving ``hydra.sweep.dir`` again: that interpolates keys of the task
    config (``paths.log_dir``) and a per-process run id, which a worker process would resolve differently."""
    parts = Path(subdir or "").parts
    output = Path(output_dir)
    return output.parents[len(parts) - 1] if parts else output


def swept_keys(overrides: Sequence[str]) -> list[str]:
    """The keys that ``overrides`` (a multirun's ``hydra.sweeper.params``, then its command line) sweep: those whose
    last value is several (``a=1,2``, ``range(...)``, ``glob(...)``, ``choice(...)``). Only the multirun itself can
    tell: each job's overrides carry one value per key, so a swept key looks no different there from a fixed one."""
    sweeps = {o.key_or_group: o.is_sweep_override() for o in OverridesParser.create().parse_overrides(list(overrides))}
    return [key for key, swept in sweeps.items() if swept]


@dataclass(frozen=True)
class SweepJob:
    """A ``-m`` job as its W&B run shows it: its sweep's directory, the keys the sweep varies and this job's values
    for them (``{"optim.lr": "optim.lr=0.001"}``, as in the job's own overrides)."""

    directory: Path
    keys: tuple[str, ...]
    overrides: dict[str, str]


def current_job() -> SweepJob | None:
    """This process's ``-m`` job, None outside a multirun. Its swept keys are the ones ``SweepReport`` found on the
    multirun's command line (none when a multirun runs without that callback)."""
    if not in_multirun():
        return None
    hydra_cfg = HydraConfig.get()
    keys = tuple(json.loads(os.environ.get(SWEPT_KEYS) or "[]"))
    overrides = {
        o.key_or_group: o.input_line for o in OverridesParser.create().parse_overrides(list(hydra_cfg.overrides.task))
    }
    mine = {key: overrides[key] for key in keys if key in overrides}
    return SweepJob(job_sweep_dir(hydra_cfg.sweep.subdir, hydra_cfg.runtime.output_dir), keys, mine)


class SweepReport(Callback):
    """Hydra callback (conf/hydra/default.yaml): record each job, keep the sweep going, summarise at the end."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            check_writable(Path(config.hydra.sweep.dir), "hydra.sweep.dir")
        except ConfigError as exc:
            raise SystemExit(f"error: {exc}") from None
        os.environ[SWEEP_ID] = uuid.uuid4().hex[:12]
        params = OmegaConf.select(config, "hydra.sweeper.params", default=None) or {}  # a sweep set in a config file
        sweep = [*(f"{key}={value}" for key, value in params.items()), *config.hydra.overrides.task]
        os.environ[SWEPT_KEYS] = json.dumps(swept_keys(sweep))  # the command line wins, as in Hydra's basic sweeper

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        hydra_cfg = job_return.hydra_cfg.hydra if job_return.hydra_cfg is not None else None
        if hydra_cfg is None or hydra_cfg.mode != RunMode.MULTIRUN or hydra_cfg.output_subdir is None:
            return  # output_subdir null: a rank > 0 of a multi-process job (hydra/launcher=slurm); rank 0 records it
        record: dict[str, Any] = {
            "num": int(hydra_cfg.job.num),
            "sweep": os.environ.get(SWEEP_ID),
            "overrides": list(job_return.overrides or []),
            "output_dir": hydra_cfg.runtime.output_dir,
            "status": "completed",
        }
        if job_return.status == JobStatus.FAILED and isinstance(job_return._return_value, RunDirectoryInUse):
            # another process (a second table sharing the cell) trains it now: its outcome is that process's
            record.update(status=HELD_ELSEWHERE, error=one_line(job_return._return_value))
            log.info("Job %d (%s): %s", record["num"], " ".join(record["overrides"]), record["error"])
            job_return.status, job_return.return_value = JobStatus.COMPLETED, None
        elif job_return.status == JobStatus.FAILED:
            error = job_return._return_value
            record.update(status="failed", error=one_line(error))
            if not isinstance(error, EXPECTED_ERRORS):
                record["traceback"] = "".join(traceback.format_exception(error))
            log.error("Job %d (%s) failed: %s", record["num"], " ".join(record["overrides"]), record["error"])
            if not getattr(error, "interrupted", False):  # a signal stops the whole sweep (below), not one job
                job_return.status, job_return.return_value = JobStatus.COMPLETED, None  # handled: the sweep goes on
        sweep_dir = job_sweep_dir(OmegaConf.select(config, "hydra.sweep.subdir"), hydra_cfg.runtime.output_dir)
        record_job(sweep_dir, record)
        if job_return.status == JobStatus.FAILED:
            print(f"{record['error']}; the sweep stops here (finished jobs: {sweep_dir / JOBS_FILE})", file=sys.stderr)
            raise SystemExit(error.exit_status)  # 128 + the signal, so a caller (the table engine) stops too

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        jobs = read_jobs(sweep_dir, os.environ.get(SWEEP_ID))
        failed = [job for job in jobs if job["status"] not in ("completed", HELD_ELSEWHERE)]
        held = [job for job in jobs if job["status"] == HELD_ELSEWHERE]
        lines = [f"Sweep {sweep_dir}: {len(jobs) - len(failed) - len(held)} of {len(jobs)} jobs completed"]
        lines += [
            f"  job {job['num']} ({' '.join(job['overrides'])}) failed: {job.get('error', 'failed')}" for job in failed
        ]
        lines += [
            f"  job {job['num']} ({' '.join(job['overrides'])}) not run here: another process trains it now"
            for job in held
        ]
        print("\n".join(lines))
        if failed:
            raise SystemExit(
                f"error: {len(failed)} of {len(jobs)} sweep jobs failed (details: {sweep_dir / JOBS_FILE})"
            )
