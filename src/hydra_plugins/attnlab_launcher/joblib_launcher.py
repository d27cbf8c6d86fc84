"""``hydra/launcher=joblib`` that outlives a killed job (conf/hydra/launcher/joblib.yaml).

Hydra's joblib launcher runs the jobs on loky workers; when one worker dies (the OOM killer, a SIGKILL) loky breaks
the pool, every job in flight dies with it and the launcher raises ``TerminatedWorkerError``: no other job finishes
and the sweep ends without its summary. Here the jobs that were running when a worker died are run again one at a
time, so the one that kills its worker is found: it is recorded as failed in ``jobs.jsonl`` (the sweep's summary
names it) and the others go on. A job re-run this way continues from its own ``last.ckpt`` when the sweep resumes
(``ckpt_path=${resume_ckpt:}``, as the table engine's sweeps do), so it loses at most the steps since its last save.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra_plugins.hydra_joblib_launcher._core import execute_job, process_joblib_cfg
from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher
from joblib import Parallel, delayed
from joblib.externals.loky import get_reusable_executor
from joblib.externals.loky.process_executor import TerminatedWorkerError

from attnlab.run_directory import record_job
from attnlab.training.sweeps import SWEEP_ID

log = logging.getLogger(__name__)


def execute_marked(marker: Path | None, *job: Any) -> tuple[int, JobReturn]:
    """Hydra's ``execute_job`` in a worker, after leaving ``marker``: the launcher's record that the job started.
    (Unpickling this imports the package, which silences Hydra's schema-matching warning in the worker.)"""
    if marker is not None:
        marker.touch()
    return job[0], execute_job(*job)


class ResilientJoblibLauncher(JoblibLauncher):
    """Hydra's ``JoblibLauncher`` (same settings) that survives a worker's death (module docstring)."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        settings = {**self.joblib, "backend": "loky"}  # as Hydra's: its threading backend cannot run Hydra jobs
        process_joblib_cfg(settings)
        log.info("Joblib.Parallel(%s) is launching %d jobs", settings, len(job_overrides))
        for idx, overrides in enumerate(job_overrides):
            log.info("\t#%d : %s", initial_job_idx + idx, " ".join(filter_overrides(overrides)))
        jobs = {initial_job_idx + idx: list(overrides) for idx, overrides in enumerate(job_overrides)}
        returns: dict[int, JobReturn] = {}
        with tempfile.TemporaryDirectory(prefix=".started-", dir=sweep_dir) as started:
            pending = list(jobs)
            while pending:
                suspects = self.run_jobs(pending, jobs, settings, Path(started), returns)
                for num in suspects:  # alone, so a death is that job's own
                    if not self.run_alone(num, jobs[num], returns):
                        returns[num] = self.lost(num, jobs[num], sweep_dir)
                pending = [num for num in pending if num not in returns]
        return [returns[num] for num in jobs]

    def run_jobs(
        self, nums: list[int], jobs: dict[int, list[str]], settings: dict, started: Path, returns: dict
    ) -> list[int]:
        """Run ``nums`` in parallel into ``returns``; the jobs that were running when a worker died (else [])."""
        state = Singleton.get_state()
        calls = (
            delayed(execute_marked)(
                started / str(num), num, jobs[num], self.hydra_context, self.config, self.task_function, state
            )
            for num in nums
        )
        try:
            for num, job_return in Parallel(**settings, return_as="generator_unordered")(calls):
                returns[num] = job_return
        except TerminatedWorkerError as error:
            suspects = [num for num in nums if num not in returns and (started / str(num)).exists()]
            for num in suspects:
                (started / str(num)).unlink()
            log.warning("A worker died (%s); re-running job(s) %s one at a time", str(error).splitlines()[-1], suspects)
            return suspects
        return []

    def run_alone(self, num: int, overrides: list[str], returns: dict) -> bool:
        """The job on a worker of its own (joblib runs ``n_jobs=1`` in this process, where a death is the sweep's);
        False when that worker died too."""
        job = (num, overrides, self.hydra_context, self.config, self.task_function, Singleton.get_state())
        future = get_reusable_executor(max_workers=1).submit(execute_marked, None, *job)
        try:
            returns[num] = future.result()[1]
        except TerminatedWorkerError:
            return False
        return True

    @staticmethod
    def lost(num: int, overrides: list[str], sweep_dir: Path) -> JobReturn:
        """A job whose worker died even alone: failed in ``jobs.jsonl``; handled, so the sweep goes on."""
        error = "error: its worker process died (killed, or out of memory) even when run alone"
        log.error("Job %d (%s) failed: %s", num, " ".join(overrides), error)
        record = {"num": num, "sweep": os.environ.get(SWEEP_ID), "overrides": overrides, "output_dir": None}
        record_job(sweep_dir, record | {"status": "failed", "error": error})
        return JobReturn(overrides=overrides, status=JobStatus.COMPLETED)
