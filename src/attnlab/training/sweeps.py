"""Sweeps that survive their failures: each job's error is that job's alone, and the multirun ends with a summary.

Hydra's sweepers re-raise the first failed job after its batch and never reach ``on_multirun_end``; this
callback records every job's outcome in ``<sweep dir>/jobs.jsonl`` (one JSON line per job, the file locked while
a line is written so parallel launchers can share it), marks the failure handled so the sweep goes on, and at the
end prints which jobs failed and why and exits non-zero if any did.
"""

from __future__ import annotations

import json
import logging
import traceback
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from attnlab.errors import ConfigError
from attnlab.runs import locked

log = logging.getLogger(__name__)

JOBS_FILE = "jobs.jsonl"
EXPECTED_ERRORS = (ConfigError,)  # reported in one line; anything else gets its traceback in the job's record


def in_multirun() -> bool:
    """True inside a Hydra ``-m`` job, where a failure must stay an exception for the sweep to record it."""
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def one_line(error: BaseException) -> str:
    """``error: <message>`` as a single line, the way a single run prints it."""
    return "error: " + " ".join(str(error).split())


def read_jobs(sweep_dir: Path) -> list[dict[str, Any]]:
    """The outcome of every job of a sweep, in job order (empty when the sweep predates ``jobs.jsonl``)."""
    path = sweep_dir / JOBS_FILE
    if not path.is_file():
        return []
    jobs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted(jobs, key=lambda job: job["num"])


class SweepReport(Callback):
    """Hydra callback (conf/hydra/default.yaml): record each job, keep the sweep going, summarise at the end."""

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        hydra_cfg = job_return.hydra_cfg.hydra if job_return.hydra_cfg is not None else None
        if hydra_cfg is None or hydra_cfg.mode != RunMode.MULTIRUN:
            return
        record: dict[str, Any] = {
            "num": int(hydra_cfg.job.num),
            "overrides": list(job_return.overrides or []),
            "output_dir": hydra_cfg.runtime.output_dir,
            "status": "completed",
        }
        if job_return.status == JobStatus.FAILED:
            error = job_return._return_value
            record.update(status="failed", error=one_line(error))
            if not isinstance(error, EXPECTED_ERRORS):
                record["traceback"] = "".join(traceback.format_exception(error))
            log.error("Job %d (%s) failed: %s", record["num"], " ".join(record["overrides"]), record["error"])
            if not getattr(error, "interrupted", False):  # a signal stops the whole sweep (below), not one job
                job_return.status, job_return.return_value = JobStatus.COMPLETED, None  # handled: the sweep goes on
        sweep_dir = Path(hydra_cfg.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        with locked(sweep_dir / JOBS_FILE, "a") as fh:
            fh.write(json.dumps(record) + "\n")
        if job_return.status == JobStatus.FAILED:
            raise SystemExit(f"{record['error']}; the sweep stops here (finished jobs: {sweep_dir / JOBS_FILE})")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        jobs = read_jobs(sweep_dir)
        failed = [job for job in jobs if job["status"] != "completed"]
        lines = [f"Sweep {sweep_dir}: {len(jobs) - len(failed)} of {len(jobs)} jobs completed"]
        lines += [f"  job {job['num']} ({' '.join(job['overrides'])}) failed: {job['error']}" for job in failed]
        print("\n".join(lines))
        if failed:
            raise SystemExit(
                f"error: {len(failed)} of {len(jobs)} sweep jobs failed (details: {sweep_dir / JOBS_FILE})"
            )
